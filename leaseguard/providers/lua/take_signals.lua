-- ARGV: member, owner, limit, nonce, token ('' for any)
--   -> {1, id1, stored1, id2, stored2, ...} | {0, holder}
-- The nonce makes a retried call (reply lost on the wire) return the same batch.
local owner, limit, nonce, token = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local cur = redis.call('HMGET', lease, 'o', 'k', 'kn', 't')
if cur[1] ~= owner or (token ~= '' and cur[4] ~= token) then
  return {0, cur[1] or ''}
end
local ids
if cur[2] == nonce then
  local n = tonumber(cur[3])
  ids = n > 0 and redis.call('LRANGE', inflight, -n, -1) or {}
else
  ids = redis.call('LPOP', queue, limit) or {}
  each_chunk(ids, function(...) redis.call('RPUSH', inflight, ...) end)
  redis.call('HSET', lease, 'k', nonce, 'kn', #ids)
  sync_index()
end
local out = {1}
for i = 1, #ids do
  out[#out + 1] = ids[i]
  out[#out + 1] = redis.call('HGET', sigs, ids[i])
end
return out
