--! include _finish.lua
-- ARGV: P, now, id, token, error, mode ('retry' | 'dead' | 'failed'), retry_at, dead_reason
--   -> 1 | 0
local now_s, id = ARGV[2], ARGV[3]
local j = J(id)
local f = redis.call('HMGET', j, 'status', 'token', 'queue', 'priority', 'attempts', 'cancel_at')
if f[1] ~= 'running' or f[2] ~= ARGV[4] then return 0 end
local q = f[3]
if cancelling(f[6]) then
  end_cancelled(j, id, q, now_s, ARGV[5])  -- never retried or dead-lettered once cancelled
  return 1
end
redis.call('HSET', j, 'attempts', tostring((whole(f[5], 0) or 0) + 1))
redis.call('ZREM', Q(q, 'lease'), id)
local mode = ARGV[6]
if mode == 'retry' then
  local at = ARGV[7]
  local m = member(at, id)
  redis.call('HSET', j, 'status', 'queued', 'eta', at, 'error', ARGV[5], 'token', '', 'worker', '',
    'lease_until', '0', 'm', m)
  if tonumber(at) <= tonumber(now_s) then
    redis.call('ZADD', Q(q, 'ready'), -(whole(f[4], -2147483647) or 0), m)
  else
    redis.call('ZADD', Q(q, 'sched'), at, id)
  end
  wake(q)
elseif mode == 'dead' then
  redis.call('HSET', j, 'error', ARGV[5])
  bury(j, id, q, now_s, ARGV[8])
else
  redis.call('HSET', j, 'status', 'failed', 'error', ARGV[5], 'token', '', 'worker', '',
    'lease_until', '0', 'finished_at', now_s)
  finish(j, id, q, tonumber(now_s))
end
return 1
