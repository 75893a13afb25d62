-- ARGV: member, owner, token, ttl_ms, nonce  ->  {1, stored} | {0}
-- Claims a handed-off grant once: the invocation that received the envelope runs the stored
-- payload only if the grant is still live, has that token and nobody claimed it before (or
-- this very call did, and this is its resend after a lost reply).
local owner, token, ttl, nonce = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cur = redis.call('HMGET', lease, 'o', 't', 'c', 'w')
if cur[1] ~= owner or cur[2] ~= token or (cur[3] == '1' and cur[4] ~= nonce) then
  return {0}
end
local stored = redis.call('HGET', sigs, owner)
if not stored then
  return {0}
end
redis.call('HSET', lease, 'c', '1', 'w', nonce)
redis.call('PEXPIRE', lease, ttl)
return {1, stored}
