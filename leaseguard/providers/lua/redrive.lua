-- redrive (operator): rows [V1] [V2] [V3].
-- ARGV: member, nonce, all (1|0), id1, id2, ... (the ids to move when not all)  ->  how many
-- moved
-- [V3] A resend of this call (the same nonce: its reply was lost and the client sent it again)
-- finds the call remembered and answers what it moved, changing nothing. [V1] The matching dead
-- letters go back to the head of the queue in the order they died, with their stored payload
-- and no attempts counted; the key is no longer halted; the rest keep their order (renumbered
-- 1..n). A free key is then orphaned work, indexed for the sweeper (D1) and run by its next
-- event (Q6). The call is remembered (the model's `r`): one entry, in the done memory, which
-- outlives it by the dedupe window [G2]. [V2] Nothing matches: nothing changes, 0.
-- The donetok field holding "<at ms>:<moved>:<nonce>": the byte \255 never occurs in UTF-8, so
-- no signal id (a done entry's field) is this name.
local REDRIVEN = '\255r'
local nonce = ARGV[2]
local last = redis.call('HGET', donetok, REDRIVEN)
if last then
  local at, count, was = string.match(last, '^(%d+):(%d+):(.*)$')
  if was == nonce and tonumber(at) > now_ms() - DEDUPE_WINDOW_MS then
    return tonumber(count) -- [V3]
  end
end
local wanted = nil
if ARGV[3] ~= '1' then
  wanted = {}
  for i = 4, #ARGV do
    wanted[ARGV[i]] = true
  end
end
local flat = redis.call('HGETALL', dead)
local moved, kept = {}, {}
for i = 1, #flat, 2 do
  local item = {id = flat[i], entry = cjson.decode(flat[i + 1])}
  if wanted == nil or wanted[item.id] then
    moved[#moved + 1] = item
  else
    kept[#kept + 1] = item
  end
end
if #moved == 0 then
  return 0 -- [V2]
end
local function by_order(a, b)
  return a.entry.n < b.entry.n
end
table.sort(moved, by_order)
table.sort(kept, by_order)
for i = #moved, 1, -1 do
  local id = moved[i].id
  redis.call('HDEL', dead, id)
  redis.call('HSET', sigs, id, moved[i].entry.r)
  redis.call('HDEL', attempts, id)
  redis.call('LPUSH', queue, id)
end
-- complete() numbers a new dead letter HLEN + 1: keep the numbers 1..n
for i = 1, #kept do
  if kept[i].entry.n ~= i then
    kept[i].entry.n = i
    redis.call('HSET', dead, kept[i].id, cjson.encode(kept[i].entry))
  end
end
if #kept == 0 then
  redis.call('ZREM', deadidx, member)
end
set_halted(false)
sync_index()
-- the model's `r` (V3), kept at least as long as any done entry (never shortens donetok's life)
redis.call('HSET', donetok, REDRIVEN, fmt(now_ms()) .. ':' .. #moved .. ':' .. nonce)
redis.call('PEXPIRE', donetok, RELEASED_MEMORY_MS)
return #moved
