--! include _finish.lua
-- ARGV: P, now, id, running ('1': request the cancel of a running job)
--   -> 'cancelled' | 'requested' | 'running' | 'finished' | 'unknown' (foundry's CancelResult)
local now_s, id = ARGV[2], ARGV[3]
local j = J(id)
local f = redis.call('HMGET', j, 'status', 'queue', 'm', 'lease_until')
if not f[1] then return 'unknown' end
if f[1] == 'cancelled' then return 'cancelled' end
if f[1] == 'queued' then
  redis.call('ZREM', Q(f[2], 'ready'), f[3])
  redis.call('ZREM', Q(f[2], 'sched'), id)
  redis.call('HSET', j, 'status', 'cancelled', 'finished_at', now_s)
  finish(j, id, f[2], tonumber(now_s))
  return 'cancelled'
end
if f[1] ~= 'running' then return 'finished' end
if ARGV[4] ~= '1' then return 'running' end
redis.call('HSETNX', j, 'cancel_at', now_s)
local until_s = finite(f[4])
if until_s ~= nil and until_s <= tonumber(now_s) then  -- held by a worker that is gone
  end_cancelled(j, id, f[2], now_s, nil)
  return 'cancelled'
end
redis.call('PUBLISH', P .. 'cancel', id)
return 'requested'
