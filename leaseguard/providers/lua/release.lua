-- release_lease: rows [L4] [L5] (with [G6] [G7]).
-- ARGV: member, owner  ->  1 if released, 0 if the caller did not hold the lease
local owner = ARGV[2]
local cur = redis.call('HMGET', lease, 'o', 't')
if cur[1] ~= owner then
  return 0 -- [L5] not the owner (or a resend of an applied release)
end
if redis.call('EXISTS', queue, inflight) == 0 then
  -- [L4] with nothing in flight complete() has nothing to do, and with nothing queued there is
  -- no index entry: free() (below) written out, with the same writes.
  redis.call('HDEL', lease, 'o', 'c', 'k', 'kn', 'w')
  redis.call('HSET', lease, 'p', owner, 'pt', cur[2])
  redis.call('PEXPIRE', lease, RELEASED_MEMORY_MS)
  return 1
end
-- @helpers
-- [L4] complete (the in-flight signals are remembered as done) and free
complete(owner, cur[2], nil, false)
free(owner, cur[2])
sync_index()
return 1
