--! include _finish.lua
-- ARGV: P, id, token, now -> 1 | 0
local id = ARGV[2]
local j = J(id)
local f = redis.call('HMGET', j, 'status', 'token', 'queue', 'priority', 'm', 'deliveries', 'cancel_at')
if f[1] ~= 'running' or f[2] ~= ARGV[3] then return 0 end
if cancelling(f[7]) then
  end_cancelled(j, id, f[3], ARGV[4], nil)
  return 1
end
local d = (whole(f[6], 0) or 1) - 1
if d < 0 then d = 0 end
redis.call('HSET', j, 'status', 'queued', 'token', '', 'worker', '', 'lease_until', '0', 'deliveries', d)
redis.call('ZREM', Q(f[3], 'lease'), id)
redis.call('ZADD', Q(f[3], 'ready'), -(whole(f[4], -2147483647) or 0), f[5])
wake(f[3])
return 1
