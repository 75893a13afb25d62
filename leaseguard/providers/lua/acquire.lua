-- acquire_lease: rows [L1] [L2] [L3] (with [G1] [G3] [G5]).
-- ARGV: member, owner, ttl_ms  ->  {acquired 0|1, holder, token}
local owner, ttl = ARGV[2], ARGV[3]
local cur = redis.call('HMGET', lease, 'o', 't', 'k', 'kn')
if cur[1] == owner then
  -- [L1] the owner again: new deadline, same token
  redis.call('PEXPIRE', lease, ttl)
  return {1, owner, cur[2]}
elseif cur[1] then
  return {0, cur[1], cur[2]} -- [L2] refused, naming the holder
end
local work = redis.call('EXISTS', queue, inflight) > 0
if not work then
  -- [L3] with nothing queued or in flight there is nothing to requeue or index: grant() and
  -- next_token() (below) written out, with the same writes, and k/kn deleted only if there
  -- (their HDEL is most of a redis.call, and a released key has neither).
  local t = redis.call('TIME')
  local last, floor = tonumber(cur[2] or '0'), tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = string.format('%.0f', last + 1 > floor and last + 1 or floor)
  redis.call('HSET', lease, 'o', owner, 't', token, 'c', '1', 'p', '', 'pt', '', 'w', '')
  if cur[3] or cur[4] then
    redis.call('HDEL', lease, 'k', 'kn')
  end
  redis.call('PEXPIRE', lease, ttl)
  redis.call('HDEL', donetok, '')
  return {1, owner, token}
end
-- @helpers
-- [L3] a dead owner's signals are not this owner's to complete: back to the head of the queue
requeue_inflight()
local token = grant(owner, ttl, '1', nil, nil, cur[2], nil)
sync_index()
return {1, owner, fmt(token)}
