-- ARGV: member, owner, ttl_ms, claimed (1|0), token ('' for any)
--   -> {1, head, token, stored_head}   handed off
--   -> {2}                             queue empty: released
--   -> {0, holder}                     the caller does not hold the lease (with that token)
local owner, ttl, claimed, token = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cur = redis.call('HMGET', lease, 'o', 'p', 't', 'pt')
if cur[1] ~= owner or (token ~= '' and cur[3] ~= token) then
  -- A retry of a step that was applied: we are the previous owner, and it was our grant (a
  -- release keeps the token; a hand-off keeps ours as pt).
  if cur[2] == owner and cur[1] and (token == '' or cur[4] == token) then
    return {1, cur[1], cur[3], redis.call('HGET', sigs, cur[1])}
  elseif cur[2] == owner and not cur[1] and (token == '' or cur[3] == token) then
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
