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
local cur = redis.call('HMGET', lease, 'o', 't', 'w', 'k', 'kn')
local holder = cur[1]
local token = holder and cur[2] or ''
-- [Q7] while the granted signal is stored: a take's report [K1] can complete it under the
-- same grant, and then the rows below answer, as for any later delivery
local resend = holder and cur[3] == nonce and redis.call('HEXISTS', sigs, holder) == 1
local no_take = not (cur[4] or cur[5]) -- no take nonce to delete at a grant
-- What this part reads (nil: not read here) is not read again below.
local entry, is_dead, known
if holder and not resend then
  entry = redis.call('HGET', donetok, id) -- done_entry()'s read
  if not entry then
    is_dead = redis.call('HEXISTS', dead, id) == 1
    if not is_dead and holder ~= id then
      known = redis.call('HEXISTS', sigs, id) == 1
      if not known then
        -- [Q2] (the hot path) queued behind the holder: the same writes as below, with
        -- store_new() and sync_index() written out. Pushed first, and taken back when that
        -- went over the bound [Q8]: the same as reading the depth first, one call fewer.
        local length = redis.call('RPUSH', queue, id)
        if length > max_queue then
          redis.call('RPOP', queue)
          return {2, holder, length - 1} -- [Q8] the queue is at its bound: refused
        end
        redis.call('HSET', sigs, id, stored)
        if redis.call('HEXISTS', state, 'h') == 1 then
          redis.call('ZREM', index, member) -- halted: left out of the index
        else
          local t = redis.call('TIME')
          local deadline = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
          deadline = deadline + math.max(redis.call('PTTL', lease), 0)
          redis.call('ZADD', index, string.format('%.0f', deadline), member)
        end
        return {0, holder, token, length}
      end
    end
  end
end
-- @helpers
if resend then
  return granted(id, holder, cur[2]) -- [Q7] a resend of this very call, which was applied
end
local _, ok, tries = done_entry(id, entry)
if not ok and is_dead == nil then
  is_dead = redis.call('HEXISTS', dead, id) == 1
end
if ok or is_dead then
  return {0, holder or '', token, 0} -- [Q5] completed or dead-lettered already: a duplicate
end
if holder == id then
  return {0, id, token, 0} -- [Q4] a second delivery of the owner
end
if known == nil then
  known = redis.call('HEXISTS', sigs, id) == 1
end
if holder and known then
  -- [Q3] queued (its place) or in flight (no place)
  local pos = redis.call('LPOS', queue, id)
  return {0, holder, token, pos and (pos + 1) or 0}
end
if not holder and not has_work() and not is_halted() then
  -- [Q1] free: the signal owns the key and stays in flight
  local granted_token = fmt(grant(id, ttl, '1', nil, nil, cur[2] or '0', nonce, no_take))
  store_new(id, stored, tries)
  redis.call('RPUSH', inflight, id)
  set_grant_token(granted_token)
  index_owned(tonumber(ttl)) -- sync_index(): in flight, under the new lease
  return {1, id, granted_token, tries or '0'}
end
if holder then
  -- (not known: [Q3] returned above.) Pushed first, and taken back when that went over the
  -- bound: the same as reading the depth first, one call fewer when queued.
  local length = redis.call('RPUSH', queue, id)
  if length > max_queue then
    redis.call('RPOP', queue)
    return {2, holder, length - 1} -- [Q8] the queue is at its bound: refused, nothing stored
  end
  store_new(id, stored, tries) -- [Q2] queued behind the holder
  index_owned(nil) -- sync_index(): queued, under the holder's lease
  return {0, holder, token, length}
end
if not known then
  local depth = redis.call('LLEN', queue)
  if depth >= max_queue then
    return {2, '', depth} -- [Q8] the queue is at its bound: refused, nothing stored
  end
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
local head, head_token = grant_head(ttl, '1', nil, nil, nonce, cur[2] or '0', no_take)
return granted(id, head, head_token)
