-- ARGV: member, from_owner, to_owner, ttl_ms  ->  {1, token} | {0}
local from, to, ttl = ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('HMGET', lease, 'o', 'p', 't')
if cur[1] == to and cur[2] == from then
  return {1, cur[3]} -- a retry of a transfer that was applied
end
if cur[1] ~= from then
  return {0}
end
local work = has_work()
if work then
  complete()
end
local token = grant(to, ttl, '1', from, cur[3])
if work then
  sync_index()
end
return {1, fmt(token)}
