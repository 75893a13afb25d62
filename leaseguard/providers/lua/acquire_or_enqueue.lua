-- acquire_or_enqueue: rows [Q1]..[Q9] (with [G1]..[G5]).
-- ARGV: member, signal_id, stored_signal, ttl_ms, nonce (unique per call), max_queue
--   -> {1, owner, token, attempts}                acquired: the caller's signal owns the key
--                                                 (attempts: its failed runs so far)
--   -> {1, owner, token, stored, attempts}        acquired an orphaned key: `owner`'s signal
--                                                 is adopted (the caller runs it first)
--   -> {0, holder|'', token|'', position}         not acquired; position 0: none (in flight,
--                                                 a second delivery, or a duplicate)
--   -> {2, holder|'', depth}                      refused: the queue holds max_queue ids [Q8]
-- The owner's own signal is kept in flight too, so if its process dies the sweeper delivers it
-- again; a second delivery of a signal that owns the key is never a second concurrent run.
local id, stored, ttl, nonce = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local max_queue = tonumber(ARGV[6])
local cur = redis.call('HMGET', lease, 'o', 't', 'w')
local holder = cur[1]
if holder and cur[3] == nonce then
  return granted(id, holder, cur[2]) -- [Q7] a resend of this very call, which was applied
end
local token = holder and cur[2] or ''
local _, ok, tries = done_entry(id)
if ok or redis.call('HEXISTS', dead, id) == 1 then
  return {0, holder or '', token, 0} -- [Q5] completed or dead-lettered already: a duplicate
end
if holder == id then
  return {0, id, token, 0} -- [Q4] a second delivery of the owner
end
local known = redis.call('HEXISTS', sigs, id) == 1
if holder and known then
  -- [Q3] queued (its place) or in flight (no place)
  local pos = redis.call('LPOS', queue, id)
  return {0, holder, token, pos and (pos + 1) or 0}
end
if not holder and not has_work() and not is_halted() then
  -- [Q1] free: the signal owns the key and stays in flight
  local granted_token = fmt(grant(id, ttl, '1', nil, nil, cur[2], nonce))
  store_new(id, stored, tries)
  redis.call('RPUSH', inflight, id)
  set_grant_token(granted_token)
  sync_index()
  return {1, id, granted_token, tries or '0'}
end
if not known then
  local depth = redis.call('LLEN', queue)
  if depth >= max_queue then
    return {2, holder or '', depth} -- [Q8] the queue is at its bound: refused, nothing stored
  end
end
if holder then
  store_new(id, stored, tries)
  local length = redis.call('RPUSH', queue, id) -- [Q2] queued behind the holder
  sync_index()
  return {0, holder, token, length}
end
-- Free with work pending. [Q9] halted: queued behind the dead letter, nothing runs.
-- [Q6] orphaned: the dead owner's work first, this signal behind it, the head owns.
requeue_inflight()
if not known then
  store_new(id, stored, tries)
  redis.call('RPUSH', queue, id)
end
if is_halted() then
  sync_index()
  return {0, '', '', redis.call('LPOS', queue, id) + 1} -- [Q9]
end
local head, head_token = grant_head(ttl, '1', nil, nil, nonce)
return granted(id, head, head_token)
