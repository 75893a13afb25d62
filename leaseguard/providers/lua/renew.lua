-- ARGV: member, owner, ttl_ms  ->  1 if renewed, 0 if the caller does not hold the lease
if redis.call('HGET', lease, 'o') ~= ARGV[2] then
  return 0
end
redis.call('PEXPIRE', lease, ARGV[3])
if has_work() then
  sync_index() -- keep the orphan index's deadline with the lease, or the sweeper re-checks it
end
return 1
