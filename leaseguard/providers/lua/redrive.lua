-- redrive (operator): rows [V1] [V2].
-- ARGV: member, all (1|0), id1, id2, ... (the ids to move when not all)  ->  how many moved
-- [V1] The matching dead letters go back to the head of the queue in the order they died, with
-- their stored payload and no attempts counted; the key is no longer halted; the rest keep
-- their order (renumbered 1..n). A free key is then orphaned work, indexed for the sweeper
-- (D1) and run by its next event (Q6). [V2] Nothing matches (a resend of an applied redrive):
-- nothing changes, 0.
local wanted = nil
if ARGV[2] ~= '1' then
  wanted = {}
  for i = 3, #ARGV do
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
return #moved
