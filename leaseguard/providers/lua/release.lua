-- release_lease: rows [L4] [L5] (with [G6] [G7]).
-- ARGV: member, owner  ->  1 if released, 0 if the caller did not hold the lease
local owner = ARGV[2]
local cur = redis.call('HMGET', lease, 'o', 't')
if cur[1] ~= owner then
  return 0 -- [L5] not the owner (or a resend of an applied release)
end
-- [L4] complete (the in-flight signals are remembered as done) and free
local work = has_work()
complete(owner, cur[2], nil, false)
free(owner, cur[2])
if work then
  sync_index()
end
return 1
