-- ARGV: member, owner, token, ttl_ms  ->  {1, stored} | {0}
-- Claims a handed-off grant once: the invocation that received the envelope runs the stored
-- payload only if the grant is still live, has that token and nobody claimed it before.
local owner, token, ttl = ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('HMGET', lease, 'o', 't', 'c')
if cur[1] ~= owner or cur[2] ~= token or cur[3] == '1' then
  return {0}
end
local stored = redis.call('HGET', sigs, owner)
if not stored then
  return {0}
end
redis.call('HSET', lease, 'c', '1')
redis.call('PEXPIRE', lease, ttl)
return {1, stored}
