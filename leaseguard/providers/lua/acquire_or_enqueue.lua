-- acquire_or_enqueue: rows [Q1]..[Q7] (with [G1]..[G5]).
-- ARGV: member, signal_id, stored_signal, ttl_ms, nonce (unique per call)
--   -> {1, owner, token}                          acquired: the caller's signal owns the key
--   -> {1, owner, token, stored, attempts}        acquired an orphaned key: `owner`'s signal
--                                                 is adopted (the caller runs it first)
--   -> {0, holder|'', token|'', position}         not acquired; position 0: none (in flight,
--                                                 a second delivery, or a duplicate)
-- The owner's own signal is kept in flight too, so if its process dies the sweeper delivers it
-- again; a second delivery of a signal that owns the key is never a second concurrent run.
local id, stored, ttl, nonce = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cur = redis.call('HMGET', lease, 'o', 't', 'w')
local holder = cur[1]
if holder and cur[3] == nonce then
  return granted(id, holder, cur[2]) -- [Q7] a resend of this very call, which was applied
end
local token = holder and cur[2] or ''
local _, ok = done_entry(id)
if ok or redis.call('HEXISTS', dead, id) == 1 then
  return {0, holder or '', token, 0} -- [Q5] completed or dead-lettered already: a duplicate
end
if holder == id then
  return {0, id, token, 0} -- [Q4] a second delivery of the owner
end
if holder then
  if redis.call('HSETNX', sigs, id, stored) == 0 then
    -- [Q3] queued (its place) or in flight (no place)
    local pos = redis.call('LPOS', queue, id)
    return {0, holder, token, pos and (pos + 1) or 0}
  end
  local length = redis.call('RPUSH', queue, id) -- [Q2] queued behind the holder
  sync_index()
  return {0, holder, token, length}
end
if not has_work() then
  -- [Q1] free: the signal owns the key and stays in flight
  local granted_token = grant(id, ttl, '1', nil, nil, cur[2], nonce)
  redis.call('HSET', sigs, id, stored)
  redis.call('RPUSH', inflight, id)
  sync_index()
  return {1, id, fmt(granted_token)}
end
-- [Q6] orphaned: the dead owner's work first, this signal behind it, the head owns
requeue_inflight()
if redis.call('HSETNX', sigs, id, stored) == 1 then
  redis.call('RPUSH', queue, id)
end
local head, head_token = grant_head(ttl, '1', nil, nil, nonce)
return granted(id, head, head_token)
