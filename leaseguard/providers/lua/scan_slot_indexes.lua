#!lua flags=no-writes,allow-cross-slot-keys
-- scan_slot_indexes (Redis Cluster, Redis 7+): read the per-slot indexes (lg:{s}:index or
-- lg:{s}:deadindex) of the slots one primary serves, in one run. Not a protocol step: a read
-- of hints, as the pipelined ZRANGEBYSCORE/ZRANGE it replaces were.
-- The index keys are named from ARGV, not declared: declared keys must share one slot, and
-- these are one per slot. allow-cross-slot-keys lets one run read keys of several slots of
-- this node; a key whose slot is not (or no longer) served here is an error, and the caller
-- falls back to redis-py's pipeline, which follows the redirection.
-- ARGV: prefix, index name, mode ('o': members scored at most ARGV[4], the orphan index;
--       'd': every member, the dead-letter index), max score, limit per slot, stop ('1': stop
--       once `limit` members are found, as the slots come in order), then one slot tag each.
-- Returns {position of the tag in ARGV minus 6, member, ...}, flattened pairs, in slot order.
local prefix, name, mode, max, limit = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local stop = ARGV[6] == '1'
local out, found = {}, 0
for i = 7, #ARGV do
  local key = prefix .. '{' .. ARGV[i] .. '}:' .. name
  local members
  if mode == 'o' then
    members = redis.call('ZRANGEBYSCORE', key, '-inf', max, 'LIMIT', 0, limit)
  else
    members = redis.call('ZRANGE', key, 0, limit - 1)
  end
  for _, member in ipairs(members) do
    out[#out + 1] = i - 6
    out[#out + 1] = member
  end
  found = found + #members
  if stop and found >= limit then
    break
  end
end
return out
