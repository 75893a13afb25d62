-- ARGV: member, owner, ttl_ms  ->  {acquired 0|1, holder, token}
local owner, ttl = ARGV[2], ARGV[3]
local cur = redis.call('HMGET', lease, 'o', 't')
if cur[1] == owner then
  redis.call('PEXPIRE', lease, ttl)
  return {1, owner, cur[2]}
elseif cur[1] then
  return {0, cur[1], cur[2]}
end
local token = grant(owner, ttl, '1', '', cur[2])
if redis.call('EXISTS', inflight) == 1 then
  -- A dead owner's signals are not this owner's to complete: back to the head of the queue.
  requeue_inflight()
  sync_index()
end
return {1, owner, fmt(token)}
