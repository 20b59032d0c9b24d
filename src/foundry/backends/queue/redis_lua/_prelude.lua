-- The helpers that lease jobs and put lapsed leases back, after those that finish them
-- (``_finish.lua``) and the keys (``_keys.lua``, which documents the layout).
--! include _finish.lua
-- Leases that lapsed: back to the queue, or to dead letters when poisonous. Only a
-- delivery its worker marked alone (field 'alone' = the delivery's token) is charged
-- ('crashes'); any other goes back uncharged (a suspect next time: see base.py).
-- Returns the ids put back in the queue (the AMQP engine republishes them).
local function reap(q, now_s, ready)
  local lk = Q(q, 'lease')
  local back = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', lk, '-inf', now_s, 'LIMIT', 0, 100)) do
    redis.call('ZREM', lk, id)
    local j = J(id)
    local f = redis.call('HMGET', j, 'status', 'max_deliveries', 'crashes', 'alone', 'token', 'priority', 'm',
      'cancel_at')
    if f[1] == 'running' and cancelling(f[8]) then
      end_cancelled(j, id, q, now_s, nil)  -- its cancel was requested: it ends here, uncharged
    elseif f[1] == 'running' then
      local most, crashes, priority = whole(f[2], 1), whole(f[3] or '0', 0), whole(f[6], -2147483647)
      if most == nil then
        malformed(j, id, q, now_s, 'max_deliveries', f[2], 'is not an integer >= 1')
      elseif crashes == nil then
        malformed(j, id, q, now_s, 'crashes', f[3], 'is not an integer >= 0')
      elseif priority == nil then
        malformed(j, id, q, now_s, 'priority', f[6], 'is not an integer')
      elseif type(f[7]) ~= 'string' then
        malformed(j, id, q, now_s, 'm', f[7], 'is not a queue position')
      else
        if f[4] and f[4] ~= '' and f[4] == f[5] then crashes = crashes + 1 end
        redis.call('HSET', j, 'crashes', tostring(crashes))
        if crashes >= most then
          bury(j, id, q, now_s, 'its worker died or hung while this job ran alone in it, ' .. crashes ..
            ' time(s) (max_deliveries=' .. most .. '): the job keeps killing or hanging its worker')
        else
          redis.call('HSET', j, 'status', 'queued', 'token', '', 'worker', '', 'lease_until', '0')
          if ready then redis.call('ZADD', Q(q, 'ready'), -priority, f[7]) end
          back[#back + 1] = {id, f[6]}
        end
      end
    end
  end
  return back
end
-- What a claim reads of a job, in one call: its status, then what the lease hands out.
local function lease_fields(j)
  return redis.call('HMGET', j, 'status', 'unit', 'payload', 'codec', 'deliveries', 'attempts',
    'max_retries', 'max_deliveries', 'timeout', 'enqueued_at', 'priority', 'trace')
end
-- Why a job (its lease_fields f) cannot be leased: field, value, problem; nil when it can.
local function unfit(f)
  if type(f[2]) ~= 'string' or f[2] == '' then return 'unit', f[2], 'is not a unit name' end
  if type(f[3]) ~= 'string' then return 'payload', f[3], 'is missing' end
  if f[4] ~= 'json' and f[4] ~= 'pickle' then return 'codec', f[4], 'is not a codec Foundry knows' end
  if not whole(f[5], 0) then return 'deliveries', f[5], 'is not an integer >= 0' end
  if not whole(f[6], 0) then return 'attempts', f[6], 'is not an integer >= 0' end
  if not whole(f[7], 0) then return 'max_retries', f[7], 'is not an integer >= 0' end
  if not whole(f[8], 1) then return 'max_deliveries', f[8], 'is not an integer >= 1' end
  if f[9] ~= '' and not (finite(f[9]) and finite(f[9]) > 0) then
    return 'timeout', f[9], 'is not a positive number'
  end
  if not finite(f[10]) then return 'enqueued_at', f[10], 'is not a finite number' end
  if not whole(f[11], -2147483647) then return 'priority', f[11], 'is not an integer' end
  return nil
end
-- '<n>:' for a length n, each made once per call (the same few lengths recur job after job)
local LEN = setmetatable({}, {__index = function(t, n)
  local s = string.format('%d:', n)
  t[n] = s
  return s
end})
-- Lease a job whose lease_fields f passed unfit (so f[5], its deliveries, is a whole number);
-- its lease-set entry goes in z ({score, member...}: the caller adds them in one ZADD). The
-- reply: {id, the other fields of the row claimed_from_reply reads, each as
-- <length>:<bytes>, in one string} -- one bulk string to parse per job instead of eleven
-- (redis.py's _lease_row unpacks it).
local function lease_job(j, id, now_s, worker, token, until_s, f, z)
  local d = string.format('%d', whole(f[5], 0) + 1)
  redis.call('HSET', j, 'status', 'running', 'deliveries', d, 'token', token, 'worker', worker,
    'lease_until', until_s, 'started_at', now_s)
  z[#z + 1] = until_s
  z[#z + 1] = id
  local row = {f[2], f[3], f[4], d, f[6], f[7], f[8], f[9], f[10], f[11], f[12] or ''}
  for i = 1, #row do row[i] = LEN[#row[i]] .. row[i] end
  return {id, table.concat(row)}
end
