-- transfer_to_next: rows [N1]..[N5] (with [G2] [G3] [G4] [G6] [G7]).
-- ARGV: member, owner, ttl_ms, claimed (1|0), token ('' for any), failed (1|0), error,
--       requeue_owner (1|0), max_attempts, halt (1|0: on_poison="halt"), dead_limit (the
--       dead letters the key may hold [G6]), then for a partial report [G8]: n, n completed
--       ids, the failed ids
--   -> {1, head, token, stored_head, attempts}   handed off
--   -> {2}                                       released (or a resend of an applied step
--                                                that released or completed)
--   -> {0, holder}                               the caller does not hold the lease
local owner, ttl, claimed, token = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cur = redis.call('HMGET', lease, 'o', 't', 'p', 'pt', 'k', 'kn')
local mine = cur[1] == owner and (token == '' or cur[2] == token)
local ids = mine and ARGV[6] ~= '1' and redis.call('LRANGE', inflight, 0, -1)
if ids and #ids < CHUNK then
  -- The owner finished without a failure (the hot path): complete() [G6], then [N1] free()
  -- [G7] or [N2]/[N3] grant_head() [G4], with sync_index() and signal_reply(), written out
  -- with the same writes and replies and fewer calls. The queue's head is taken first (no
  -- signal is both queued and in flight: it is none of `ids`), the in-flight list is
  -- rewritten in place, the p/pt copy goes with the done entries (free() and grant() both
  -- write it, the same), and nothing this script knows is read again.
  local grant_token = cur[2]
  local halted = redis.call('HEXISTS', state, 'h') == 1
  local head = false -- false: the queue is empty (or halted)
  if not halted then
    head = redis.call('LPOP', queue)
  end
  if #ids > 0 then
    redis.call('HDEL', sigs, unpack(ids))
  end
  local head_tries = nil
  local clear = #ids > 0
  if head then
    -- the head's attempts and whether any of ids has a count to delete, in one read
    local tries = redis.call('HMGET', attempts, head, unpack(ids))
    head_tries, clear = tries[1] or '0', false
    for i = 1, #ids do
      if tries[i + 1] then
        clear = true
      end
      if ids[i] == head then
        head_tries, clear = nil, true
      end
    end
  end
  if clear then
    redis.call('HDEL', attempts, unpack(ids))
  end
  if head and #ids > 0 then
    redis.call('LSET', inflight, 0, head) -- the head alone in flight
    if #ids > 1 then
      redis.call('LTRIM', inflight, 0, 0)
    end
  elseif head then
    redis.call('RPUSH', inflight, head)
  elseif #ids > 0 then
    redis.call('DEL', inflight)
  end
  -- [G2] remember_done(ids and the owner): prune_done(), the entries, then DONE_LIMIT
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local now = math.floor(now_us / 1000)
  local n, batch = 0, 1
  while true do
    local oldest = redis.call('ZRANGE', done, 0, batch - 1)
    if #oldest == 0 then
      break
    end
    local entries = redis.call('HMGET', donetok, unpack(oldest))
    local old = {}
    for i = 1, #oldest do
      local at = entries[i] and tonumber(string.match(entries[i], '^(%d+):')) or 0
      if at > now - DEDUPE_WINDOW_MS then
        break
      end
      old[#old + 1] = oldest[i]
    end
    if #old > 0 then
      redis.call('ZREM', done, unpack(old))
      redis.call('HDEL', donetok, unpack(old))
    end
    if #old < #oldest then
      n = tonumber(redis.call('ZRANGE', done, -1, -1, 'WITHSCORES')[2])
      break
    end
    batch = 100
  end
  ids[#ids + 1] = owner
  local entry = string.format('%.0f', now) .. ':' .. grant_token .. ':1'
  local scored, entries = {}, {}
  for i = 1, #ids do
    scored[2 * i - 1], scored[2 * i] = string.format('%.0f', n + i), ids[i]
    entries[2 * i - 1], entries[2 * i] = ids[i], entry
  end
  entries[#entries + 1] = ''
  entries[#entries + 1] = grant_token .. ':' .. owner
  redis.call('ZADD', done, unpack(scored))
  redis.call('HSET', donetok, unpack(entries))
  local excess = redis.call('ZRANGE', done, 0, -DONE_LIMIT - 1)
  for i = 1, #excess, CHUNK do
    local part = {unpack(excess, i, math.min(i + CHUNK - 1, #excess))}
    redis.call('ZREM', done, unpack(part))
    redis.call('HDEL', donetok, unpack(part))
  end
  redis.call('PEXPIRE', done, DEDUPE_WINDOW_MS)
  redis.call('PEXPIRE', donetok, DEDUPE_WINDOW_MS)
  if not head then
    -- [N1] nothing queued (or halted): released
    redis.call('HDEL', lease, 'o', 'c', 'k', 'kn', 'w')
    redis.call('HSET', lease, 'p', owner, 'pt', grant_token)
    redis.call('PEXPIRE', lease, RELEASED_MEMORY_MS)
    redis.call('ZREM', index, member) -- nothing in flight; nothing queued, or halted
    if not halted or redis.call('LLEN', queue) == 0 then
      redis.call('HDEL', state, 'g', 'u')
    end
    return {2}
  end
  -- [N2] / [N3] the head owns the key now, claimed by the caller or left to a claim
  local last = tonumber(grant_token)
  local granted = string.format('%.0f', last + 1 > now_us and last + 1 or now_us)
  redis.call('HSET', lease, 'o', head, 't', granted, 'c', claimed, 'p', owner,
             'pt', grant_token, 'w', '')
  if cur[5] or cur[6] then
    redis.call('HDEL', lease, 'k', 'kn')
  end
  redis.call('PEXPIRE', lease, ttl)
  -- g, and [G5] u while the head's grant is unclaimed (grant() in the prelude, the same)
  if claimed == '0' then
    redis.call('HSET', state, 'g', granted, 'u', '1')
  else
    redis.call('HSET', state, 'g', granted)
    redis.call('HDEL', state, 'u')
  end
  redis.call('ZADD', index, string.format('%.0f', now + tonumber(ttl)), member)
  local stored = redis.call('HGET', sigs, head)
  return {1, head, granted, stored, head_tries or redis.call('HGET', attempts, head) or '0'}
end
-- @helpers
local failure = nil
if ARGV[6] == '1' then
  failure = {error = ARGV[7], requeue_owner = ARGV[8] == '1', max_attempts = tonumber(ARGV[9]),
             halt = ARGV[10] == '1', dead_limit = tonumber(ARGV[11])}
  if ARGV[12] then
    failure.completed, failure.failed = {}, {}
    local n = tonumber(ARGV[12])
    for i = 13, #ARGV do
      (i < 13 + n and failure.completed or failure.failed)[ARGV[i]] = true
    end
  end
end
if not mine then
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
