-- renew_lease: rows [R1] [R2].
-- ARGV: member, owner, ttl_ms, token ('' for any)  ->  1 if renewed, 0 if the caller does not
-- hold the lease (with that token)
local cur = redis.call('HMGET', lease, 'o', 't')
if cur[1] ~= ARGV[2] or (ARGV[4] ~= '' and cur[2] ~= ARGV[4]) then
  return 0 -- [R2] never brings back an expired lease
end
redis.call('PEXPIRE', lease, ARGV[3]) -- [R1]
if redis.call('EXISTS', queue, inflight) == 0 then
  return 1 -- no index entry to move
end
-- @helpers
sync_index() -- keep the orphan index's deadline with the lease, or the sweeper re-checks it
return 1
