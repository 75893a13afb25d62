-- adopt_orphans, one candidate key: rows [D1] [D2] [D3] [D4] (with [G4] [G5]).
-- ARGV: member, ttl_ms, claimed (1|0), nonce  ->  {1, head, token, stored_head, attempts} | {0}
-- Re-checks one candidate from the index: adopts it only if its owner's lease is gone.
local ttl, claimed, nonce = ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('HMGET', lease, 'o', 't', 'w')
if cur[1] then
  if cur[3] == nonce and redis.call('HEXISTS', sigs, cur[1]) == 1 then
    return signal_reply({1}, cur[1], cur[2]) -- [D3] a resend of this adoption
  end
  sync_index() -- [D2] the owner is alive (it renewed since the index entry was written)
  return {0}
end
if is_halted() then
  sync_index() -- [D4] halted: nothing runs until a redrive (and the index leaves it out)
  return {0}
end
requeue_inflight()
if redis.call('LLEN', queue) == 0 then
  sync_index()
  return {0}
end
-- [D1] the head of the dead owner's work owns the key
local head, head_token = grant_head(ttl, claimed, nil, nil, nonce)
return signal_reply({1}, head, head_token)
