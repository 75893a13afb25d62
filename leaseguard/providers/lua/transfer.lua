-- transfer_lease: rows [T1] [T2] [T3] (with [G3] [G6]).
-- ARGV: member, from_owner, to_owner, ttl_ms  ->  {1, token} | {0}
local from, to, ttl = ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('HMGET', lease, 'o', 'p', 't')
if cur[1] == to and cur[2] == from then
  return {1, cur[3]} -- [T3] a resend of a transfer that was applied
end
if cur[1] ~= from then
  return {0} -- [T2]
end
-- [T1] the old owner's work is complete; the new owner gets a new token, no gap between
local work = has_work()
complete(from, cur[3], nil, false)
local token = grant(to, ttl, '1', from, cur[3], cur[3], nil)
if work then
  sync_index()
end
return {1, fmt(token)}
