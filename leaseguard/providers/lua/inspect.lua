-- ARGV: member  ->  {owner, token, pttl, {id, stored, ...}, {in-flight ids}}
local cur = redis.call('HMGET', lease, 'o', 't')
local ids = redis.call('LRANGE', queue, 0, -1)
local queued = {}
for i = 1, #ids do
  queued[#queued + 1] = ids[i]
  queued[#queued + 1] = redis.call('HGET', sigs, ids[i])
end
local live = cur[1] and 1 or 0
return {cur[1] or '', live == 1 and cur[2] or '', redis.call('PTTL', lease), queued,
        redis.call('LRANGE', inflight, 0, -1)}
