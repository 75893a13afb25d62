-- acquire_lease: rows [L1] [L2] [L3] (with [G1] [G3] [G5]).
-- ARGV: member, owner, ttl_ms  ->  {acquired 0|1, holder, token}
local owner, ttl = ARGV[2], ARGV[3]
local cur = redis.call('HMGET', lease, 'o', 't')
if cur[1] == owner then
  -- [L1] the owner again: new deadline, same token
  redis.call('PEXPIRE', lease, ttl)
  return {1, owner, cur[2]}
elseif cur[1] then
  return {0, cur[1], cur[2]} -- [L2] refused, naming the holder
end
-- [L3] a dead owner's signals are not this owner's to complete: back to the head of the queue
local work = has_work()
if work then
  requeue_inflight()
end
local token = grant(owner, ttl, '1', nil, nil, cur[2], nil)
if work then
  sync_index()
end
return {1, owner, fmt(token)}
