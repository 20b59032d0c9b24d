--! include _finish.lua
-- ARGV: P, now, id -> queue name | false
local now_s, id = ARGV[2], ARGV[3]
local j = J(id)
local f = redis.call('HMGET', j, 'status', 'queue', 'priority', 'key')
if f[1] ~= 'dead' and f[1] ~= 'failed' then return false end
local q = f[2]
local m = member(now_s, id)
redis.call('HSET', j, 'status', 'queued', 'eta', now_s, 'deliveries', '0', 'attempts', '0', 'crashes', '0',
  'token', '', 'worker', '', 'lease_until', '0', 'm', m)
redis.call('HDEL', j, 'result', 'error', 'dead_reason', 'finished_at', 'alone', 'cancel_at', 'progress')
redis.call('ZREM', Q(q, 'dead'), id)
redis.call('ZREM', P .. 'dead', id)
redis.call('ZREM', P .. 'fin', fin_member(q, id))
redis.call('PERSIST', j)
if f[4] and f[4] ~= '' then redis.call('PERSIST', P .. 'k:' .. f[4]) end
redis.call('ZADD', Q(q, 'ready'), -(whole(f[3], -2147483647) or 0), m)
wake(q)
return q
