--! include _prelude.lua
-- ARGV: P, now, (id, token, result)...  -> '1' or '0' per job, in one string (one reply to read)
local now_s = ARGV[2]
local res = {}
for i = 3, #ARGV, 3 do
  local id = ARGV[i]
  local j = J(id)
  local f = redis.call('HMGET', j, 'status', 'queue', 'm', 'cancel_at', 'result_ttl', 'key')
  if f[1] == 'running' and cancelling(f[4]) then
    end_cancelled(j, id, f[2], now_s, nil)  -- a cancel was requested: the result is dropped
    res[#res + 1] = '0'
  elseif f[1] == 'queued' or f[1] == 'running' then
    if f[1] == 'queued' then  -- a running job is in the lease set only (finish takes it out)
      redis.call('ZREM', Q(f[2], 'ready'), f[3])
      redis.call('ZREM', Q(f[2], 'sched'), id)
    end
    redis.call('HSET', j, 'status', 'succeeded', 'result', ARGV[i + 2], 'token', '', 'worker', '',
      'lease_until', '0', 'finished_at', now_s)
    redis.call('HDEL', j, 'error')
    finish(j, id, f[2], tonumber(now_s), {f[5], f[6]})
    res[#res + 1] = '1'
  else
    res[#res + 1] = '0'
  end
end
return table.concat(res)
