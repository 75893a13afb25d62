-- Shared by every leaseguard script. All keys of one lease key share one hash tag, so each
-- script runs on one Redis Cluster node and touches nothing else.
--   KEYS[1] lease     hash {o=owner, t=token, c=claimed, p/pt=previous owner and its token,
--                            k/kn=take nonce/count, w=nonce of the call that granted/claimed}
--   KEYS[2] queue     list of signal ids, oldest first
--   KEYS[3] signals   hash id -> stored signal, for queued and in-flight signals
--   KEYS[4] inflight  list of ids the current owner received and has not completed
--   KEYS[5] index     zset of lease keys with work pending -> deadline (server ms)
--   ARGV[1] the user's key (the index member)
local lease, queue, sigs, inflight, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local member = ARGV[1]
-- A released lease keeps its token this long, so an immediate re-acquire continues from it.
local TOKEN_MEMORY_MS = 60000
local CHUNK = 1000

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function fmt(n)
  return string.format('%.0f', n)
end

-- One above the last token, and never below the server clock in microseconds: the clock keeps
-- tokens rising after the lease hash expired or was lost in a restart.
local function next_token(last)
  local floor = now_us()
  if last + 1 > floor then
    return last + 1
  end
  return floor
end

-- `last` is the token when the caller already read it. Fields of an earlier owner that are not
-- overwritten here (k, kn: a take nonce) only ever match that owner's own retries. `nonce`
-- names the call that made this grant, so a resend of that call (its reply was lost) can tell
-- its own grant from someone else's.
local function grant(owner, ttl, claimed, previous, last, nonce)
  last = tonumber(last or redis.call('HGET', lease, 't') or '0')
  local token = next_token(last)
  redis.call('HSET', lease, 'o', owner, 't', fmt(token), 'c', claimed, 'p', previous,
             'pt', fmt(last), 'w', nonce or '')
  redis.call('PEXPIRE', lease, ttl)
  return token
end

-- Whether the key has queued or in-flight signals; without any, the queue bookkeeping (and the
-- index, which sync_index already cleared at the last change) can be skipped.
local function has_work()
  return redis.call('EXISTS', queue, inflight) > 0
end

local function free(owner)
  redis.call('HDEL', lease, 'o', 'c', 'k', 'kn', 'w')
  redis.call('HSET', lease, 'p', owner)
  redis.call('PEXPIRE', lease, TOKEN_MEMORY_MS)
end

local function each_chunk(ids, fn)
  for i = 1, #ids, CHUNK do
    fn(unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
  end
end

-- The owner finished: the signals it received are done.
local function complete()
  local ids = redis.call('LRANGE', inflight, 0, -1)
  if #ids > 0 then
    each_chunk(ids, function(...) redis.call('HDEL', sigs, ...) end)
    redis.call('DEL', inflight)
  end
end

-- The owner died: what it received goes back to the head of the queue, in order.
local function requeue_inflight()
  local ids = redis.call('LRANGE', inflight, 0, -1)
  for i = #ids, 1, -1 do
    redis.call('LPUSH', queue, ids[i])
  end
  redis.call('DEL', inflight)
end

local function sync_index()
  if redis.call('LLEN', queue) > 0 or redis.call('LLEN', inflight) > 0 then
    local deadline = math.floor(now_us() / 1000)
    if redis.call('HEXISTS', lease, 'o') == 1 then
      deadline = deadline + math.max(redis.call('PTTL', lease), 0)
    end
    redis.call('ZADD', index, fmt(deadline), member)
  else
    redis.call('ZREM', index, member)
  end
end

local function grant_head(ttl, claimed, previous, nonce)
  local head = redis.call('LPOP', queue)
  local token = grant(head, ttl, claimed, previous, nil, nonce)
  redis.call('RPUSH', inflight, head)
  sync_index()
  return {head, fmt(token), redis.call('HGET', sigs, head)}
end

-- The reply of a grant made by the call with `nonce`, if the lease still is that grant: a
-- resent call returns what the first run did instead of reading its own grant as someone
-- else's. {1, owner, token} when the caller's own signal got it, else the adopted head too.
local function granted_by(nonce, id)
  local cur = redis.call('HMGET', lease, 'o', 't', 'w')
  if not cur[1] or cur[3] ~= nonce then
    return nil
  end
  if cur[1] == id then
    return {1, cur[1], cur[2]}
  end
  return {1, cur[1], cur[2], redis.call('HGET', sigs, cur[1])}
end
