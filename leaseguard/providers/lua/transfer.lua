-- transfer_lease: rows [T1] [T2] [T3] (with [G3] [G6]).
-- ARGV: member, from_owner, to_owner, ttl_ms  ->  {1, token} | {0}
local from, to, ttl = ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('HMGET', lease, 'o', 'p', 't', 'k', 'kn')
if cur[1] == to and cur[2] == from then
  return {1, cur[3]} -- [T3] a resend of a transfer that was applied
end
if cur[1] ~= from then
  return {0} -- [T2]
end
-- [T1] the old owner's work is complete; the new owner gets a new token, no gap between
local work = redis.call('EXISTS', queue, inflight) > 0
if not work then
  -- With nothing in flight complete() has nothing to do, and with nothing queued there is no
  -- index entry: grant() and next_token() (below) written out, with the same writes, and k/kn
  -- deleted only if there.
  local t = redis.call('TIME')
  local last, floor = tonumber(cur[3]), tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = string.format('%.0f', last + 1 > floor and last + 1 or floor)
  redis.call('HSET', lease, 'o', to, 't', token, 'c', '1', 'p', from, 'pt', cur[3], 'w', '')
  if cur[4] or cur[5] then
    redis.call('HDEL', lease, 'k', 'kn')
  end
  redis.call('PEXPIRE', lease, ttl)
  redis.call('HSET', donetok, '', cur[3] .. ':' .. from)
  redis.call('PEXPIRE', donetok, RELEASED_MEMORY_MS)
  return {1, token}
end
-- @helpers
complete(from, cur[3], nil, false)
local token = grant(to, ttl, '1', from, cur[3], cur[3], nil)
sync_index()
return {1, fmt(token)}
