-- claim_signal: rows [C1] [C2] [C3] [C4] (with [G4] [G5]).
-- ARGV: member, owner, token, ttl_ms, nonce  ->  {1, stored, attempts, token} | {0}
-- Claims a handed-off grant once: the invocation that received the envelope runs the stored
-- payload only if the grant is still live, has that token and nobody claimed it before (or
-- this very call did, and this is its resend after a lost reply). [C4]: the grant's lease ran
-- out with its signal still first in flight: the envelope's retry runs it under a new token.
local owner, token, ttl, nonce = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cur = redis.call('HMGET', lease, 'o', 't', 'c', 'w')
if cur[1] == owner and cur[4] == nonce then
  local stored = redis.call('HGET', sigs, owner)
  if stored then
    return {1, stored, attempts_of(owner), cur[2]} -- [C1]/[C4] again: a resend of it
  end
end
if not cur[1] and not is_halted() and redis.call('LINDEX', inflight, 0) == owner then
  -- The lease hash expired with the grant: its token is g (the model's t).
  local last = cur[2] or redis.call('HGET', state, 'g')
  if last == token then
    -- [C4] the receiver that claimed it died, or the envelope came late: G5 (one more
    -- attempt), then the head (this signal) owns, claimed by this call
    requeue_inflight()
    local head, head_token = grant_head(ttl, '1', nil, nil, nonce, last)
    return {1, redis.call('HGET', sigs, head), attempts_of(head), head_token}
  end
end
if cur[1] ~= owner or cur[2] ~= token then
  return {0} -- [C3] stale, forged, or the grant moved on
end
local stored = redis.call('HGET', sigs, owner)
if not stored then
  return {0} -- [C3]
end
if cur[3] == '1' then
  return {0} -- [C2] claimed before by another call (a duplicate envelope)
end
redis.call('HSET', lease, 'c', '1', 'w', nonce) -- [C1]
redis.call('HDEL', state, 'u') -- [G5] started: a requeue now counts it
redis.call('PEXPIRE', lease, ttl)
return {1, stored, attempts_of(owner), cur[2]}
