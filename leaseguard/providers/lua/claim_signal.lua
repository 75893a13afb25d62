-- claim_signal: rows [C1] [C2] [C3].
-- ARGV: member, owner, token, ttl_ms, nonce  ->  {1, stored, attempts} | {0}
-- Claims a handed-off grant once: the invocation that received the envelope runs the stored
-- payload only if the grant is still live, has that token and nobody claimed it before (or
-- this very call did, and this is its resend after a lost reply).
local owner, token, ttl, nonce = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cur = redis.call('HMGET', lease, 'o', 't', 'c', 'w')
if cur[1] ~= owner or cur[2] ~= token then
  return {0} -- [C3] stale, forged, or the grant moved on
end
local stored = redis.call('HGET', sigs, owner)
if not stored then
  return {0} -- [C3]
end
if cur[3] == '1' and cur[4] ~= nonce then
  return {0} -- [C2] claimed before by another call (a duplicate envelope)
end
redis.call('HSET', lease, 'c', '1', 'w', nonce) -- [C1] (or its resend)
redis.call('PEXPIRE', lease, ttl)
return {1, stored, attempts_of(owner)}
