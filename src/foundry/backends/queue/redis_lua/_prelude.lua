-- The helpers that lease and finish jobs, after the keys (``_keys.lua``, which documents
-- the layout).
--! include _keys.lua
-- f: the job's {result_ttl, key} when the caller already read them (else read here);
-- later: a batch's {fin = {score, member...}, lease = {queue = {id...}}} to add those to
-- (one ZADD and one ZREM per queue for the batch, by ``finish_later``), else written now
local function finish(j, id, q, now, f, later)
  f = f or redis.call('HMGET', j, 'result_ttl', 'key')
  local ttl = tonumber(f[1])
  if ttl == nil or ttl ~= ttl or ttl <= 0 or ttl > 3e9 then ttl = 604800 end  -- none or malformed: 7 days
  local exp = now + ttl
  local ms = string.format('%.0f', math.floor(exp * 1000))
  if later then
    local ids = later.lease[q]
    if not ids then
      ids = {}
      later.lease[q] = ids
    end
    ids[#ids + 1] = id
    later.fin[#later.fin + 1] = string.format('%.6f', exp)
    later.fin[#later.fin + 1] = fin_member(q, id)
  else
    redis.call('ZREM', Q(q, 'lease'), id)
    redis.call('ZADD', P .. 'fin', string.format('%.6f', exp), fin_member(q, id))
  end
  redis.call('PEXPIREAT', j, ms)
  if f[2] and f[2] ~= '' then redis.call('PEXPIREAT', P .. 'k:' .. f[2], ms) end
  redis.call('PUBLISH', P .. 'done', id)
end
local function finish_later(later)
  for q, ids in pairs(later.lease) do zmany('ZREM', Q(q, 'lease'), ids) end
  if #later.fin > 0 then zmany('ZADD', P .. 'fin', later.fin) end
end
-- A running job with a cancel request ends here, whatever its delivery asked for (a
-- completion, a retry, a dead letter, a release, or its lease lapsed): 'cancelled', the
-- error (when given) kept.
local function cancelling(v) return v ~= nil and v ~= false and v ~= '' end
local function end_cancelled(j, id, q, now_s, err)
  redis.call('HSET', j, 'status', 'cancelled', 'token', '', 'worker', '', 'lease_until', '0',
    'finished_at', now_s)
  redis.call('HDEL', j, 'result')
  if err and err ~= '' then redis.call('HSET', j, 'error', err) end
  finish(j, id, q, tonumber(now_s))
end
local function bury(j, id, q, now_s, reason)
  redis.call('HSET', j, 'status', 'dead', 'dead_reason', reason, 'token', '', 'worker', '',
    'lease_until', '0', 'finished_at', now_s)
  redis.call('ZADD', Q(q, 'dead'), now_s, id)
  redis.call('ZADD', P .. 'dead', now_s, id)
  finish(j, id, q, tonumber(now_s))
end
-- A record Foundry did not write (or that was altered): dead-lettered, never run. The
-- reason follows foundry.errors.MalformedRecordError's text.
local function malformed(j, id, q, now_s, field, value, problem)
  local shown = tostring(value)
  if value == false or value == nil then shown = 'missing' end
  if #shown > 80 then shown = string.sub(shown, 1, 77) .. '...' end
  bury(j, id, q, now_s, "the stored record is malformed, so it was not run: malformed record '" .. id ..
    "': " .. field .. "='" .. shown .. "' " .. problem .. '. Fix: the record was not written by Foundry ' ..
    'or was altered; correct or delete it in the store (Foundry does not run it)')
end
local function whole(v, low)  -- a decimal integer >= low (what HINCRBY and Python accept), or nil
  if type(v) ~= 'string' or #v > 11 or not string.match(v, '^%-?%d+$') then return nil end
  local n = tonumber(v)
  if n == nil or n < low or n > 2147483647 then return nil end
  return n
end
local function finite(v)  -- a finite number, or nil
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return nil end
  return n
end
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
-- Lease a job whose lease_fields f passed unfit (so f[5], its deliveries, is a whole number);
-- its lease-set entry goes in z ({score, member...}: the caller adds them in one ZADD). The
-- reply: {id, the other fields of the row claimed_from_reply reads, each as
-- <length>:<bytes>, in one string} -- one bulk string to parse per job instead of eleven
-- (redis.py's _lease_row unpacks it).
local function lease_job(j, id, now_s, worker, token, until_s, f, z)
  local d = tonumber(f[5]) + 1
  redis.call('HSET', j, 'status', 'running', 'deliveries', tostring(d), 'token', token, 'worker', worker,
    'lease_until', until_s, 'started_at', now_s)
  z[#z + 1] = until_s
  z[#z + 1] = id
  local row = {f[2], f[3], f[4], tostring(d), f[6], f[7], f[8], f[9], f[10], f[11], f[12] or ''}
  for i = 1, #row do row[i] = #row[i] .. ':' .. row[i] end
  return {id, table.concat(row)}
end
