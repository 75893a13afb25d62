-- ARGV: member, owner, ttl_ms, claimed (1|0)
--   -> {1, head, token, stored_head}   handed off
--   -> {2}                             queue empty: released
--   -> {0, holder}                     the caller does not hold the lease
local owner, ttl, claimed = ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('HMGET', lease, 'o', 'p', 't')
if cur[1] ~= owner then
  if cur[2] == owner then -- a retry of a step that was applied
    if cur[1] then
      return {1, cur[1], cur[3], redis.call('HGET', sigs, cur[1])}
    end
    return {2}
  end
  return {0, cur[1] or ''}
end
complete()
if redis.call('LLEN', queue) == 0 then
  free(owner)
  sync_index()
  return {2}
end
local head = grant_head(ttl, claimed, owner)
return {1, head[1], head[2], head[3]}
