-- Shared by every leaseguard script: the shared rows [G1]..[G7] of the protocol model
-- (leaseguard/protocol/model.py, the spec; each script names the rows it implements). All keys
-- of one lease key share one hash tag, so each script runs on one Redis Cluster node and
-- touches nothing else.
--   KEYS[1] lease     hash {o=owner, t=token, c=claimed, w=grant nonce, p/pt=previous owner and
--                           its token ('' for none), k/kn=take nonce/count}; PEXPIRE = the
--                           owner's deadline [G1] (expiry is the server's)
--   KEYS[2] queue     list of signal ids, oldest first
--   KEYS[3] signals   hash id -> stored signal, for queued and in-flight signals
--   KEYS[4] inflight  list of ids the current owner received and has not completed
--   KEYS[5] index     zset of user keys with work pending -> deadline (server ms)
--   KEYS[6] done      zset id -> insertion number: completed ids, oldest first [G2]
--   KEYS[7] donetok   hash id -> "<completed at ms>:<grant token>:<ok 1|0>" [G2], with
--                           ":<attempts>" after a failed entry whose count is not 0 (the
--                           owner's own signal removed by [G6]: its retry resumes it); and field
--                           '' (never an id) -> "<pt>:<p>": p/pt again, for [N4] after the lease
--                           hash expired with its owner (the model keeps p/pt then); written
--                           by a grant that names a previous owner, and kept at least
--                           RELEASED_MEMORY_MS (a release writes none: its hash keeps p/pt);
--                           field '\255r' -> the last redrive that moved something [V3]
--   KEYS[8] attempts  hash id -> failed runs so far, for stored signals that failed (absent: 0)
--   KEYS[9] dead      hash id -> JSON {n=order, r=stored signal, a=attempts, e=error, at=ms}:
--                           the key's dead letters [G6]; n runs 1..HLEN in the order they died
--   KEYS[10] state    hash {h='1' while halted [G6] (until a redrive [V1]), g=the token of the
--                           grant whose signals are in flight, u='1' while the first in-flight
--                           id is an unclaimed grant's [G5]: it never started, so a requeue
--                           keeps its count}: kept apart from the lease hash,
--                           which expires with the owner's lease (the model keeps h and t then;
--                           [C4] needs the expired grant's token). Gone when empty.
--   KEYS[11] deadidx  zset of user keys that hold dead letters (all scores 0), for
--                           dead_letter_keys; one per Cluster slot, like the index
--   ARGV[1] the user's key (the index member)
-- DEDUPE_WINDOW_MS, DONE_LIMIT and TOKEN_MEMORY_MS are defined above this text by
-- leaseguard/providers/redis/scripts.py from the model's constants.
local lease, queue, sigs, inflight, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local done, donetok, attempts, dead = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local state, deadidx = KEYS[10], KEYS[11]
local member = ARGV[1]
-- [G7] A released key keeps t, p and pt while the model keeps its record: at least the token
-- memory, and as long as the released owner is remembered as done.
local RELEASED_MEMORY_MS = math.max(TOKEN_MEMORY_MS, DEDUPE_WINDOW_MS)
local CHUNK = 1000 -- unpack() has a C-stack limit (8000): big id lists go in chunks

-- The helpers below are closures, built anew on every run (about 2 us of server time for all
-- of them). A step's fast path (its text above its own `-- @helpers` line) is placed here, ahead
-- of them, so the common case returns before any is built; it uses none of them.
-- @helpers

-- The model's `now`: one server time per step, read on first use.
local clock_us
local function now_us()
  if not clock_us then
    local t = redis.call('TIME')
    clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock_us
end

local function now_ms()
  return math.floor(now_us() / 1000)
end

local function fmt(n)
  return string.format('%.0f', n)
end

local function each_chunk(ids, fn)
  for i = 1, #ids, CHUNK do
    fn(unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
  end
end

-- [G3] One above the last token, and never below the server clock in microseconds: the clock
-- keeps tokens rising after the lease hash expired or was lost in a restart.
local function next_token(last)
  local floor = now_us()
  if last + 1 > floor then
    return last + 1
  end
  return floor
end

-- h: whether the key is halted (read once per script run, kept in step by set_halted).
local halted_flag
local function is_halted()
  if halted_flag == nil then
    halted_flag = redis.call('HEXISTS', state, 'h') == 1
  end
  return halted_flag
end

local function set_halted(on)
  if on then
    redis.call('HSET', state, 'h', '1')
  else
    redis.call('HDEL', state, 'h')
  end
  halted_flag = on
end

-- g: the token of the grant that put signals in flight (called wherever ids enter the in-flight
-- list). While the in-flight list is not empty, g is the model's t even after the lease hash
-- expired with its owner; [C4] reads it then.
local function set_grant_token(token)
  redis.call('HSET', state, 'g', token)
end

-- [G3] A new owner. `last` is the token when the caller already read it ('0': the hash has
-- none); `previous` and `previous_token` are the model's prev/prev_token, `nonce` its
-- grant_nonce (nil: none); `no_take` true when the caller read k and kn and neither is there
-- (their HDEL is skipped).
local function grant(owner, ttl, claimed, previous, previous_token, last, nonce, no_take)
  last = tonumber(last or redis.call('HGET', lease, 't') or '0')
  local token = next_token(last)
  redis.call('HSET', lease, 'o', owner, 't', fmt(token), 'c', claimed, 'p', previous or '',
             'pt', previous_token or '', 'w', nonce or '')
  if not no_take then
    redis.call('HDEL', lease, 'k', 'kn')
  end
  redis.call('PEXPIRE', lease, ttl)
  -- [G5] u: this grant's signal (the first in flight, grant_head) is unclaimed until C1.
  -- The lease hash (and its c) expires with the owner; the requeue reads u after that.
  if claimed == '0' then
    redis.call('HSET', state, 'u', '1')
  else
    redis.call('HDEL', state, 'u')
  end
  if previous then
    redis.call('HSET', donetok, '', previous_token .. ':' .. previous)
    redis.call('PEXPIRE', donetok, RELEASED_MEMORY_MS) -- never shorter than the done memory's
  else
    redis.call('HDEL', donetok, '')
  end
  return token
end

-- Whether the key has queued or in-flight signals; without any, the queue bookkeeping (and the
-- index, which sync_index already cleared at the last change) can be skipped.
local function has_work()
  return redis.call('EXISTS', queue, inflight) > 0
end

-- sync_index() (below) when the caller knows the key has work and an owner whose lease runs
-- `ttl` ms more (nil: read its PTTL), so neither is read again.
local function index_owned(ttl)
  if is_halted() then
    redis.call('ZREM', index, member)
  else
    local deadline = now_ms()
    redis.call('ZADD', index, fmt(deadline + (ttl or math.max(redis.call('PTTL', lease), 0))),
               member)
  end
end

-- The orphan index (keys with signals queued or in flight), scored by the owner's deadline. A
-- halted key is left out: nothing is granted from its queue until a redrive [D4] [V1], so the
-- sweeper would only re-check it on every pass.
local function sync_index()
  local work = redis.call('LLEN', queue) > 0 or redis.call('LLEN', inflight) > 0
  if work and not is_halted() then
    local deadline = now_ms()
    if redis.call('HEXISTS', lease, 'o') == 1 then
      deadline = deadline + math.max(redis.call('PTTL', lease), 0)
    end
    redis.call('ZADD', index, fmt(deadline), member)
  else
    redis.call('ZREM', index, member)
    if not work then
      redis.call('HDEL', state, 'g', 'u') -- nothing in flight: no grant to remember
    end
  end
end

local function attempts_of(id)
  return redis.call('HGET', attempts, id) or '0'
end

-- The model's `signal(rec, id, token)`: {id, token, stored, attempts}, appended to `out`.
local function signal_reply(out, id, token)
  out[#out + 1] = id
  out[#out + 1] = token
  out[#out + 1] = redis.call('HGET', sigs, id)
  out[#out + 1] = attempts_of(id)
  return out
end

-- {id, stored, attempts, ...} of stored signals `ids` (no token), appended to `out`.
local function append_signals(out, ids)
  for i = 1, #ids, CHUNK do
    local part = {unpack(ids, i, math.min(i + CHUNK - 1, #ids))}
    local records = redis.call('HMGET', sigs, unpack(part))
    local tries = redis.call('HMGET', attempts, unpack(part))
    for j = 1, #part do
      out[#out + 1] = part[j]
      out[#out + 1] = records[j]
      out[#out + 1] = tries[j] or '0'
    end
  end
  return out
end

-- [G4] The head of the queue becomes owner and stays in flight until it completes. `last`: the
-- last token when the caller knows it (else read from the lease hash). The head is in flight
-- under a lease of `ttl` ms: sync_index() without its reads.
local function grant_head(ttl, claimed, previous, previous_token, nonce, last, no_take)
  local head = redis.call('LPOP', queue)
  local token = fmt(grant(head, ttl, claimed, previous, previous_token, last, nonce, no_take))
  redis.call('RPUSH', inflight, head)
  set_grant_token(token)
  index_owned(tonumber(ttl))
  return head, token
end

-- The model's `granted`: the reply of a grant that is the current lease. The caller's own
-- signal `id` owns the key: {1, owner, token, attempts} (its stored attempts); else the owner's
-- signal is adopted (to run first): {1, owner, token, stored, attempts}.
local function granted(id, owner, token)
  if owner == id then
    return {1, owner, token, attempts_of(id)}
  end
  return signal_reply({1}, owner, token)
end

-- [G5] A dead owner's in-flight signals go back to the head of the queue, in order, each with
-- one more attempt when a run of it started (a run that never finished counts); the first one
-- of an unclaimed grant (u) never started and keeps its count.
local function requeue_inflight()
  local ids = redis.call('LRANGE', inflight, 0, -1)
  local unstarted = redis.call('HGET', state, 'u') == '1' and ids[1] or nil
  for i = #ids, 1, -1 do
    if ids[i] ~= unstarted then
      redis.call('HINCRBY', attempts, ids[i], 1)
    end
    redis.call('LPUSH', queue, ids[i])
  end
  redis.call('DEL', inflight)
  redis.call('HDEL', state, 'u')
end

-- [G2] Completed ids older than the dedupe window are forgotten: a read ignores an old entry
-- (done_entry), a write drops the old ones first (prune_done), and both keys expire with the
-- newest entry.
local function done_entry(id, entry)
  if entry == nil then
    entry = redis.call('HGET', donetok, id) -- (false: the caller read it, and there is none)
  end
  if not entry then
    return nil
  end
  local at, token, ok, tries = string.match(entry, '^(%d+):(%d+):([01]):?(%d*)$')
  if not at or tonumber(at) <= now_ms() - DEDUPE_WINDOW_MS then
    return nil
  end
  return token, ok == '1', tries ~= '' and tries or '0'
end

-- The model's `stored_new`: signal `id` is stored anew (as `stored`); `tries` is the attempts
-- of its failed done entry (done_entry's third value, nil or '0' for none): a platform retry of
-- an event whose own run failed resumes that count.
local function store_new(id, stored, tries)
  redis.call('HSET', sigs, id, stored)
  if tries and tries ~= '0' then
    redis.call('HSET', attempts, id, tries)
  end
end

local function forget_done(ids)
  each_chunk(ids, function(...)
    redis.call('ZREM', done, ...)
    redis.call('HDEL', donetok, ...)
  end)
end

-- Whether any completed id is left after the old ones are forgotten.
local function prune_done()
  local horizon = now_ms() - DEDUPE_WINDOW_MS
  local batch = 1 -- usually the oldest entry is still in the window: one look is enough
  while true do
    local oldest = redis.call('ZRANGE', done, 0, batch - 1)
    if #oldest == 0 then
      return false
    end
    local entries = redis.call('HMGET', donetok, unpack(oldest))
    local old = {}
    for i = 1, #oldest do
      local at = entries[i] and tonumber(string.match(entries[i], '^(%d+):')) or 0
      if at > horizon then
        break
      end
      old[#old + 1] = oldest[i]
    end
    forget_done(old)
    if #old < #oldest then
      return true
    end
    batch = 100
  end
end

-- [G2] The model's `remember_done` for each of `ids` in order (a repeated id moves to the
-- end), then at most DONE_LIMIT are kept, the oldest forgotten first. `tries` (a failed
-- entry's attempts, nil for 0) is kept with each entry.
local function remember_done(ids, token, ok, tries)
  local n = 0
  if prune_done() then
    n = tonumber(redis.call('ZRANGE', done, -1, -1, 'WITHSCORES')[2])
  end
  local entry = fmt(now_ms()) .. ':' .. token .. ':' .. (ok and '1' or '0')
  if tries and tries > 0 then
    entry = entry .. ':' .. fmt(tries)
  end
  for i = 1, #ids, CHUNK do
    local scored, entries = {}, {}
    for j = i, math.min(i + CHUNK - 1, #ids) do
      n = n + 1
      scored[#scored + 1] = fmt(n)
      scored[#scored + 1] = ids[j]
      entries[#entries + 1] = ids[j]
      entries[#entries + 1] = entry
    end
    redis.call('ZADD', done, unpack(scored))
    redis.call('HSET', donetok, unpack(entries))
  end
  -- the oldest beyond DONE_LIMIT (none when under it)
  local excess = redis.call('ZRANGE', done, 0, -DONE_LIMIT - 1)
  if #excess > 0 then
    forget_done(excess)
  end
  redis.call('PEXPIRE', done, DEDUPE_WINDOW_MS)
  redis.call('PEXPIRE', donetok, DEDUPE_WINDOW_MS)
end

-- Completed signals `ids` are no longer stored: their records and attempt counts go.
local function unstore(ids)
  each_chunk(ids, function(...) redis.call('HDEL', sigs, ...) end)
  each_chunk(ids, function(...) redis.call('HDEL', attempts, ...) end)
end

-- [G6] The owner (holding grant `token`) finished. Without a `failure` its in-flight signals are
-- done (remembered for dedupe). A failure {error=, requeue_owner=, max_attempts=, halt=,
-- dead_limit=} gives each one more attempt: dead-lettered at max_attempts (indexed in deadidx;
-- halting the key with failure.halt) while the key holds fewer than dead_limit dead letters;
-- with no room left it goes back to the head with its count (failed work is never dropped) and
-- the key halts until a redrive [V1]; below max_attempts back to the head in in-flight order,
-- except the owner's own when not
-- requeue_owner: removed (the platform retries it), its count kept in its failed done entry for
-- that retry (store_new). A partial report [G8] adds sets completed= (done) and failed= (as
-- above): an id in neither never ran and goes back with its count. The owner's id is remembered
-- either way (ok when it completed): a resend of its step is recognised by it after a newcomer
-- overwrote p/pt [N4]. `mark_owner`: only transfer_to_next remembers a successful owner (the
-- contract's release and transfer do not: a plain owner is no signal).
local function complete(owner, token, failure, mark_owner)
  local ids = redis.call('LRANGE', inflight, 0, -1)
  if not failure then
    if #ids > 0 then
      unstore(ids)
      redis.call('DEL', inflight)
    end
    if mark_owner then
      ids[#ids + 1] = owner
    end
    if #ids > 0 then
      remember_done(ids, token, true)
    end
    return
  end
  local back, ok = {}, {}
  local own_tries = 0
  local partial = failure.completed
  for i = 1, #ids do
    local id = ids[i]
    if partial and partial[id] then
      ok[#ok + 1] = id -- [G8] it ran and succeeded
    elseif partial and not failure.failed[id] then
      back[#back + 1] = id -- [G8] it never ran: back to the head, its count kept
    else
      local tries = tonumber(attempts_of(id)) + 1
      if tries >= failure.max_attempts and redis.call('HLEN', dead) >= failure.dead_limit then
        -- [G6] dead_limit dead letters already: it waits at the head, the key halted
        redis.call('HSET', attempts, id, tries)
        back[#back + 1] = id
        set_halted(true)
      elseif tries >= failure.max_attempts then
        local entry = cjson.encode({n = redis.call('HLEN', dead) + 1,
                                    r = redis.call('HGET', sigs, id), a = tries,
                                    e = failure.error, at = now_ms()})
        redis.call('HSET', dead, id, entry)
        redis.call('HDEL', sigs, id)
        redis.call('HDEL', attempts, id)
        redis.call('ZADD', deadidx, 0, member)
        if failure.halt then
          set_halted(true)
        end
      elseif id ~= owner or failure.requeue_owner then
        redis.call('HSET', attempts, id, tries)
        back[#back + 1] = id
      else
        redis.call('HDEL', sigs, id)
        redis.call('HDEL', attempts, id)
        own_tries = tries
      end
    end
  end
  if #ok > 0 then
    unstore(ok)
    remember_done(ok, token, true)
  end
  local owner_ok = partial and partial[owner] or false
  remember_done({owner}, token, owner_ok, own_tries)
  for i = #back, 1, -1 do
    redis.call('LPUSH', queue, back[i])
  end
  redis.call('DEL', inflight)
end

-- [G7] Released (not expired): the key keeps t and names the released grant in p/pt. The
-- hash keeps them for RELEASED_MEMORY_MS, as long as the model remembers them, so no copy goes
-- to the done memory (one there would be read only after the hash expired, and writing it made
-- a donetok hash with no expiry on a key that had none).
local function free(owner, token)
  redis.call('HDEL', lease, 'o', 'c', 'k', 'kn', 'w')
  redis.call('HSET', lease, 'p', owner, 'pt', token)
  redis.call('PEXPIRE', lease, RELEASED_MEMORY_MS)
end

-- The model's prev/prev_token: from the lease hash (`p`, `pt` as read into `p`, `pt`), or,
-- when the hash expired with its owner, from their copy in the done memory (set by every grant
-- that names a previous owner, kept as long as the completion is remembered and at least
-- RELEASED_MEMORY_MS).
local function previous_owner(p, pt)
  if p then
    return p, pt
  end
  local copy = redis.call('HGET', donetok, '')
  if not copy then
    return nil, nil
  end
  local copy_pt, copy_p = string.match(copy, '^(%d+):(.*)$')
  return copy_p, copy_pt
end
