--! include _finish.lua
-- ARGV: P, now, (id, token, result)...  -> '1' or '0' per job, in one string (one reply to read)
local now_s = ARGV[2]
local now = tonumber(now_s)
local res = {}
local later = {fin = {}, lease = {}}  -- the batch's lease-set removals and expiry entries, one call each
for i = 3, #ARGV, 3 do
  local id = ARGV[i]
  local j = J(id)
  local f = redis.call('HMGET', j, 'status', 'queue', 'm', 'cancel_at', 'result_ttl', 'key', 'attempts')
  if f[1] == 'running' and cancelling(f[4]) then
    end_cancelled(j, id, f[2], now_s, nil)  -- a cancel was requested: the result is dropped
    res[#res + 1] = '0'
  elseif f[1] == 'queued' or f[1] == 'running' then
    if f[1] == 'queued' then  -- a running job is in the lease set only (finish takes it out)
      redis.call('ZREM', Q(f[2], 'ready'), f[3])
      redis.call('ZREM', Q(f[2], 'sched'), id)
    end
    -- token, worker and lease_until stay as the last lease left them: every script that
    -- reads them checks the status first, and a finished job's record is never leased again
    redis.call('HSET', j, 'status', 'succeeded', 'result', ARGV[i + 2], 'finished_at', now_s)
    if f[7] ~= '0' then redis.call('HDEL', j, 'error') end  -- only an attempt that failed left one
    finish(j, id, f[2], now, {f[5], f[6]}, later)
    res[#res + 1] = '1'
  else
    res[#res + 1] = '0'
  end
end
finish_later(later)
return table.concat(res)
