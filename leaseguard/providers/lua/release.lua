-- ARGV: member, owner  ->  1 if released, 0 if the caller did not hold the lease
local owner = ARGV[2]
if redis.call('HGET', lease, 'o') ~= owner then
  return 0
end
if has_work() then
  complete()
  free(owner)
  sync_index()
else
  free(owner)
end
return 1
