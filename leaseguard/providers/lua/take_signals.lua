-- take_signals: rows [K1] [K2] [K3].
-- ARGV: member, owner, limit, nonce, token ('' for any), then the completed ids (in flight,
--       ran and succeeded since the last report)
--   -> {1, id1, stored1, attempts1, id2, stored2, attempts2, ...} | {0, holder}
-- The nonce makes a retried call (reply lost on the wire) return the same batch (and
-- leaves its report applied once).
local owner, limit, nonce, token = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local cur = redis.call('HMGET', lease, 'o', 'k', 'kn', 't')
if cur[1] ~= owner or (token ~= '' and cur[4] ~= token) then
  return {0, cur[1] or ''} -- [K3]
end
local ids
if cur[2] == nonce then
  -- [K2] a resend: the same batch
  local n = tonumber(cur[3])
  ids = n > 0 and redis.call('LRANGE', inflight, -n, -1) or {}
else
  -- [K1] what ran and succeeded since the last report is done before the next is taken, so
  -- a crash after this step neither runs nor charges it again [G5]
  if #ARGV > 5 then
    local reported = {}
    for i = 6, #ARGV do
      reported[ARGV[i]] = true
    end
    local ok = {}
    for _, id in ipairs(redis.call('LRANGE', inflight, 0, -1)) do
      if reported[id] then
        ok[#ok + 1] = id
        reported[id] = nil -- an id is in flight at most once; named twice, it completes once
      end
    end
    for i = 1, #ok do
      redis.call('LREM', inflight, 1, ok[i])
    end
    if #ok > 0 then
      unstore(ok)
      remember_done(ok, cur[4], true)
    end
  end
  ids = redis.call('LPOP', queue, limit) or {}
  each_chunk(ids, function(...) redis.call('RPUSH', inflight, ...) end)
  redis.call('HSET', lease, 'k', nonce, 'kn', #ids)
  if #ids > 0 then
    set_grant_token(cur[4])
  end
  sync_index()
end
return append_signals({1}, ids)
