-- inspect_key (the model's `inspect`, with [G1]).
-- ARGV: member  ->  {owner, token, pttl, {id, stored, attempts, ...}, {in-flight ids},
--                    {dead id, dead entry, ...}, halted (1|0)}
local cur = redis.call('HMGET', lease, 'o', 't')
local queued = append_signals({}, redis.call('LRANGE', queue, 0, -1))
return {cur[1] or '', cur[1] and cur[2] or '', redis.call('PTTL', lease), queued,
        redis.call('LRANGE', inflight, 0, -1), redis.call('HGETALL', dead),
        is_halted() and 1 or 0}
