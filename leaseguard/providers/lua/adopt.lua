-- ARGV: member, ttl_ms, claimed (1|0), nonce  ->  {1, head, token, stored_head} | {0}
-- Re-checks one candidate from the index: adopts it only if its owner's lease is gone.
local ttl, claimed, nonce = ARGV[2], ARGV[3], ARGV[4]
local again = granted_by(nonce, '')
if again then
  return again -- a resend of this call, which was applied
end
if redis.call('HEXISTS', lease, 'o') == 1 then
  sync_index() -- the owner renewed since the index entry was written: move its deadline
  return {0}
end
requeue_inflight()
if redis.call('LLEN', queue) == 0 then
  sync_index()
  return {0}
end
local head = grant_head(ttl, claimed, '', nonce)
return {1, head[1], head[2], head[3]}
