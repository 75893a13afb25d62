-- ARGV: member, signal_id, stored_signal, ttl_ms, nonce (unique per call)
--   -> {1, owner, token}                      acquired
--   -> {1, head, token, stored_head}          acquired an orphaned key: run head first
--   -> {0, holder, token, position}           queued (position 0: already in flight)
-- The owner's own signal is kept in flight too, so if its process dies the sweeper delivers it
-- again; and a second delivery of a signal that owns the key is a duplicate, never a second
-- concurrent run under the same owner id.
local id, stored, ttl, nonce = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local again = granted_by(nonce, id)
if again then
  return again -- a resend of this call, which was applied: the same grant, not a duplicate
end
local cur = redis.call('HMGET', lease, 'o', 't')
if cur[1] == id then
  return {0, id, cur[2], 0}
end
if cur[1] then
  if redis.call('HSETNX', sigs, id, stored) == 1 then
    local length = redis.call('RPUSH', queue, id)
    sync_index()
    return {0, cur[1], cur[2], length}
  end
  local pos = redis.call('LPOS', queue, id)
  return {0, cur[1], cur[2], pos and (pos + 1) or 0}
end
if not has_work() then
  local token = grant(id, ttl, '1', '', cur[2], nonce)
  redis.call('HSET', sigs, id, stored)
  redis.call('RPUSH', inflight, id)
  sync_index()
  return {1, id, fmt(token)}
end
-- The previous owner died with work pending: that work goes first, this signal behind it.
requeue_inflight()
if redis.call('HSETNX', sigs, id, stored) == 1 then
  redis.call('RPUSH', queue, id)
end
local head = grant_head(ttl, '1', '', nonce)
return {1, head[1], head[2], head[3]}
