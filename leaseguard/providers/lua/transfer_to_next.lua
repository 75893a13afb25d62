-- transfer_to_next: rows [N1]..[N5] (with [G2] [G3] [G4] [G6] [G7]).
-- ARGV: member, owner, ttl_ms, claimed (1|0), token ('' for any), failed (1|0), error,
--       requeue_owner (1|0), max_attempts, halt (1|0: on_poison="halt")
--   -> {1, head, token, stored_head, attempts}   handed off
--   -> {2}                                       released (or a resend of an applied step
--                                                that released or completed)
--   -> {0, holder}                               the caller does not hold the lease
local owner, ttl, claimed, token = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local failure = nil
if ARGV[6] == '1' then
  failure = {error = ARGV[7], requeue_owner = ARGV[8] == '1', max_attempts = tonumber(ARGV[9]),
             halt = ARGV[10] == '1'}
end
local cur = redis.call('HMGET', lease, 'o', 't', 'p', 'pt')
if cur[1] ~= owner or (token ~= '' and cur[2] ~= token) then
  -- [N4] a resend of a step that was applied: we handed over or released last, or our grant
  -- is remembered as completed.
  local p, pt = previous_owner(cur[3], cur[4])
  if p == owner and (token == '' or pt == token) then
    if not cur[1] then
      return {2}
    elseif redis.call('LPOS', inflight, cur[1]) then
      return signal_reply({1}, cur[1], cur[2]) -- the head our hand-off granted (in flight)
    end
    -- (p/pt name us but the owner is not a signal we handed to: transfer_lease moved the
    -- key. The done memory below decides.)
  end
  if token ~= '' and done_entry(owner) == token then
    return {2}
  end
  return {0, cur[1] or ''} -- [N5]
end
local grant_token = cur[2]
complete(owner, grant_token, failure, true)
if redis.call('LLEN', queue) == 0 or is_halted() then
  free(owner, grant_token) -- [N1] nothing queued (or halted): released
  sync_index()
  return {2}
end
-- [N2] / [N3] the head owns the key now, claimed by the caller or left to a claim
local head, head_token = grant_head(ttl, claimed, owner, grant_token, nil)
return signal_reply({1}, head, head_token)
