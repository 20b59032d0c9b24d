"""The Lua scripts of the Redis queue (``redis.py``). Each runs atomically on the server,
so every state change of a job is one script: no other client ever sees half of it.

Keys under the prefix ``P`` (``ARGV[1]``, ending in ``:``):

==========================  ===============================================================
``P j:<id>``                hash: the job's whole record (fields as in ``FIELDS`` below)
``P k:<key>``               string: idempotency key -> job id (expires with the job)
``P q:<queue>:ready``       zset: claimable jobs; score ``-priority``, member
                            ``<eta µs, 17 digits><seq, 12 digits><id>`` (so equal scores sort
                            by eta, then enqueue order: FIFO within a priority)
``P q:<queue>:sched``       zset: delayed jobs and scheduled retries; score ``eta``
``P q:<queue>:lease``       zset: leased jobs; score ``lease_until``
``P q:<queue>:dead``        zset: dead letters of the queue; score ``finished_at``
``P q:<queue>:wake``        list: wake-up tokens for claimers blocked in ``BLPOP``
``P dead``                  zset: every dead letter; ``P fin``: finished jobs by expiry
``P seq``, ``P queues``     enqueue counter; the set of queue names
``P done`` (channel)        ``PUBLISH``-ed job ids when a job finishes (``wait``)
``P cancel`` (channel)      ``PUBLISH``-ed job ids when a running job's cancel is requested
==========================  ===============================================================

A running job whose cancel was requested has the field ``cancel_at``; every script that
ends a delivery (complete, fail, release, a lapsed lease) then writes ``cancelled``.

Keys are computed inside the scripts, so a Redis Cluster needs the whole prefix in one
hash slot: use a hash-tagged prefix such as ``{foundry}``.
"""

from __future__ import annotations

__all__ = ["SCRIPTS"]

_PRELUDE = r"""
local P = ARGV[1]
local function J(id) return P .. 'j:' .. id end
local function Q(q, s) return P .. 'q:' .. q .. ':' .. s end
local function member(eta, id)
  local seq = redis.call('INCR', P .. 'seq')
  local us = tonumber(eta) * 1000000
  if us < 0 then us = 0 elseif us > 9e15 then us = 9e15 end
  return string.format('%017.0f%012.0f', us, seq) .. id
end
local function fin_member(q, id) return string.format('%03d', #q) .. q .. id end
local function wake(q)
  local w = Q(q, 'wake')
  if redis.call('LLEN', w) < 64 then redis.call('RPUSH', w, '1') end
end
local function finish(j, id, q, now)
  local f = redis.call('HMGET', j, 'result_ttl', 'key')
  local ttl = tonumber(f[1])
  if ttl == nil or ttl ~= ttl or ttl <= 0 or ttl > 3e9 then ttl = 604800 end  -- a malformed one: 7 days
  local exp = now + ttl
  local ms = string.format('%.0f', math.floor(exp * 1000))
  redis.call('ZREM', Q(q, 'lease'), id)
  redis.call('ZADD', P .. 'fin', string.format('%.6f', exp), fin_member(q, id))
  redis.call('PEXPIREAT', j, ms)
  if f[2] and f[2] ~= '' then redis.call('PEXPIREAT', P .. 'k:' .. f[2], ms) end
  redis.call('PUBLISH', P .. 'done', id)
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
-- Lease a job whose lease_fields f passed unfit; the reply row claimed_from_reply reads.
local function lease_job(j, id, q, now_s, worker, token, until_s, f)
  local d = redis.call('HINCRBY', j, 'deliveries', 1)
  redis.call('HSET', j, 'status', 'running', 'token', token, 'worker', worker, 'lease_until', until_s,
    'started_at', now_s)
  redis.call('ZADD', Q(q, 'lease'), until_s, id)
  return {id, f[2], f[3], f[4], d, f[6], f[7], f[8], f[9], f[10], f[11], f[12] or ''}
end
"""

# ARGV: P, now, id, queue, unit, payload, codec, key, priority, eta, max_retries,
#       max_deliveries, timeout, result_ttl, trace  ->  {created 0/1, id}
_ENQUEUE = r"""
local now, id, q, key = ARGV[2], ARGV[3], ARGV[4], ARGV[8]
if key ~= '' then
  local other = redis.call('GET', P .. 'k:' .. key)
  if other then return {0, other} end
end
local j = J(id)
if redis.call('EXISTS', j) == 1 then return {0, id} end
if key ~= '' then redis.call('SET', P .. 'k:' .. key, id) end
local eta = ARGV[10]
local m = member(eta, id)
redis.call('HSET', j, 'id', id, 'queue', q, 'unit', ARGV[5], 'payload', ARGV[6], 'codec', ARGV[7],
  'key', key, 'priority', ARGV[9], 'eta', eta, 'status', 'queued', 'token', '', 'worker', '',
  'lease_until', '0', 'deliveries', '0', 'attempts', '0', 'max_retries', ARGV[11],
  'max_deliveries', ARGV[12], 'timeout', ARGV[13], 'result_ttl', ARGV[14], 'enqueued_at', now, 'm', m,
  'trace', ARGV[15] or '')
if tonumber(eta) <= tonumber(now) then
  redis.call('ZADD', Q(q, 'ready'), -tonumber(ARGV[9]), m)
else
  redis.call('ZADD', Q(q, 'sched'), eta, id)
end
wake(q)
redis.call('SADD', P .. 'queues', q)
return {1, id}
"""

# ARGV: P, now, queue, worker, token, lease_until, limit
#   -> {jobs, next scheduled eta or '', next lease deadline or ''}
_CLAIM = r"""
local now_s, q = ARGV[2], ARGV[3]
local rk, sk = Q(q, 'ready'), Q(q, 'sched')
reap(q, now_s, true)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', sk, '-inf', now_s, 'LIMIT', 0, 1000)) do
  redis.call('ZREM', sk, id)
  local f = redis.call('HMGET', J(id), 'status', 'priority', 'm')
  if f[1] == 'queued' then
    local priority = whole(f[2], -2147483647)
    if priority == nil then
      malformed(J(id), id, q, now_s, 'priority', f[2], 'is not an integer')
    elseif type(f[3]) ~= 'string' then
      malformed(J(id), id, q, now_s, 'm', f[3], 'is not a queue position')
    else
      redis.call('ZADD', rk, -priority, f[3])
    end
  end
end
local out, limit = {}, tonumber(ARGV[7])
while #out < limit do
  local popped = redis.call('ZPOPMIN', rk, limit - #out)
  if #popped == 0 then break end
  for i = 1, #popped, 2 do
    local id = string.sub(popped[i], 30)
    local j = J(id)
    local f = lease_fields(j)
    if f[1] == 'queued' then
      local field, value, problem = unfit(f)
      if field then
        malformed(j, id, q, now_s, field, value, problem)
      else
        out[#out + 1] = lease_job(j, id, q, now_s, ARGV[4], ARGV[5], ARGV[6], f)
      end
    end
  end
end
if redis.call('ZCARD', rk) == 0 then redis.call('DEL', Q(q, 'wake')) end
local a = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')
local b = redis.call('ZRANGE', Q(q, 'lease'), 0, 0, 'WITHSCORES')
return {out, a[2] or '', b[2] or ''}
"""

# ARGV: P, queue, now, worker, token, lease_until, id...  -> {claimed jobs, {id, status, eta}...}
# (the AMQP engine: the broker chose these jobs; lease those still queued and due)
_CLAIM_IDS = r"""
local q, now_s = ARGV[2], ARGV[3]
local now = tonumber(now_s)
local out, other = {}, {}
for i = 7, #ARGV do
  local id = ARGV[i]
  local j = J(id)
  local f = redis.call('HMGET', j, 'status', 'eta', 'queue', 'm')
  local field, value, problem, g = nil, nil, nil, nil
  if f[1] == 'queued' and f[3] == q then
    if not finite(f[2]) then
      field, value, problem = 'eta', f[2], 'is not a finite number'
    else
      g = lease_fields(j)
      field, value, problem = unfit(g)
    end
    if field then
      if f[4] then redis.call('ZREM', Q(q, 'ready'), f[4]) end
      redis.call('ZREM', Q(q, 'sched'), id)
      malformed(j, id, q, now_s, field, value, problem)
      f[1] = 'dead'
    end
  end
  if f[1] == 'queued' and f[3] == q and finite(f[2]) <= now then
    if f[4] then redis.call('ZREM', Q(q, 'ready'), f[4]) end
    redis.call('ZREM', Q(q, 'sched'), id)
    out[#out + 1] = lease_job(j, id, q, now_s, ARGV[4], ARGV[5], ARGV[6], g)
  else
    other[#other + 1] = {id, f[1] or '', f[2] or ''}
  end
end
return {out, other}
"""

# ARGV: P, queue, now  -> {{id, priority}...} put back in the queue
_REAP = r"""
return reap(ARGV[2], ARGV[3], true)
"""

# ARGV: P, id, token, lease_until -> 1 | 0
_HEARTBEAT = r"""
local j = J(ARGV[2])
local f = redis.call('HMGET', j, 'status', 'token', 'queue')
if f[1] ~= 'running' or f[2] ~= ARGV[3] then return 0 end
redis.call('HSET', j, 'lease_until', ARGV[4])
redis.call('ZADD', Q(f[3], 'lease'), ARGV[4], ARGV[2])
return 1
"""

# ARGV: P, id, token, record -> 1 | 0 (the running delivery's progress, fenced by its token)
_PROGRESS = r"""
local j = J(ARGV[2])
local f = redis.call('HMGET', j, 'status', 'token')
if f[1] ~= 'running' or f[2] ~= ARGV[3] then return 0 end
redis.call('HSET', j, 'progress', ARGV[4])
return 1
"""

# ARGV: P, id, token -> 1 | 0 (this delivery runs alone: a lapse now is charged to it)
_MARK_ALONE = r"""
local j = J(ARGV[2])
local f = redis.call('HMGET', j, 'status', 'token')
if f[1] ~= 'running' or f[2] ~= ARGV[3] then return 0 end
redis.call('HSET', j, 'alone', ARGV[3])
return 1
"""

# ARGV: P, now, (id, token, result)...  -> {1 | 0 ...}
_COMPLETE = r"""
local now_s = ARGV[2]
local res = {}
for i = 3, #ARGV, 3 do
  local id = ARGV[i]
  local j = J(id)
  local f = redis.call('HMGET', j, 'status', 'queue', 'm', 'cancel_at')
  if f[1] == 'running' and cancelling(f[4]) then
    end_cancelled(j, id, f[2], now_s, nil)  -- a cancel was requested: the result is dropped
    res[#res + 1] = 0
  elseif f[1] == 'queued' or f[1] == 'running' then
    redis.call('ZREM', Q(f[2], 'ready'), f[3])
    redis.call('ZREM', Q(f[2], 'sched'), id)
    redis.call('HSET', j, 'status', 'succeeded', 'result', ARGV[i + 2], 'token', '', 'worker', '',
      'lease_until', '0', 'finished_at', now_s)
    redis.call('HDEL', j, 'error')
    finish(j, id, f[2], tonumber(now_s))
    res[#res + 1] = 1
  else
    res[#res + 1] = 0
  end
end
return res
"""

# ARGV: P, now, id, token, error, mode ('retry' | 'dead' | 'failed'), retry_at, dead_reason
#   -> 1 | 0
_FAIL = r"""
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
"""

# ARGV: P, id, token, now -> 1 | 0
_RELEASE = r"""
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
"""

# ARGV: P, now, id, running ('1': request the cancel of a running job)
#   -> 'cancelled' | 'requested' | 'running' | 'finished' | 'unknown' (foundry's CancelResult)
_CANCEL = r"""
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
"""

# ARGV: P, now, id -> queue name | false
_REQUEUE = r"""
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
"""

# ARGV: P, now, limit -> {purged, looked at}
_PURGE = r"""
local ids = redis.call('ZRANGEBYSCORE', P .. 'fin', '-inf', '(' .. ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local n = 0
for _, fm in ipairs(ids) do
  redis.call('ZREM', P .. 'fin', fm)
  local ql = tonumber(string.sub(fm, 1, 3))
  local q = string.sub(fm, 4, 3 + ql)
  local id = string.sub(fm, 4 + ql)
  local j = J(id)
  local f = redis.call('HMGET', j, 'status', 'key')
  if f[1] == 'succeeded' or f[1] == 'failed' or f[1] == 'dead' or f[1] == 'cancelled' then
    redis.call('DEL', j)
    if f[2] and f[2] ~= '' and redis.call('GET', P .. 'k:' .. f[2]) == id then
      redis.call('DEL', P .. 'k:' .. f[2])
    end
    n = n + 1
  end
  if not f[1] or f[1] == 'succeeded' or f[1] == 'failed' or f[1] == 'dead' or f[1] == 'cancelled' then
    redis.call('ZREM', Q(q, 'dead'), id)
    redis.call('ZREM', P .. 'dead', id)
  end
end
return {n, #ids}
"""

# ARGV: P, now, queue -> {depth, scheduled, running, dead, oldest eta or ''}
_STATS = r"""
local now_s, q = ARGV[2], ARGV[3]
local rk, sk = Q(q, 'ready'), Q(q, 'sched')
local depth = redis.call('ZCARD', rk) + redis.call('ZCOUNT', sk, '-inf', now_s)
local scheduled = redis.call('ZCOUNT', sk, '(' .. now_s, '+inf')
local oldest = nil
local s = '-inf'
for _ = 1, 64 do
  local first = redis.call('ZRANGEBYSCORE', rk, s, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #first == 0 then break end
  local eta = (tonumber(string.sub(first[1], 1, 17)) or 0) / 1000000  -- 0: a member Foundry did not add
  if eta > 0 and (oldest == nil or eta < oldest) then oldest = eta end
  s = '(' .. first[2]
end
local d = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')
if d[2] and tonumber(d[2]) <= tonumber(now_s) and (oldest == nil or tonumber(d[2]) < oldest) then
  oldest = tonumber(d[2])
end
local o = ''
if oldest ~= nil then o = string.format('%.6f', oldest) end
return {depth, scheduled, redis.call('ZCARD', Q(q, 'lease')), redis.call('ZCARD', Q(q, 'dead')), o}
"""

SCRIPTS: dict[str, str] = {
    name: _PRELUDE + body
    for name, body in {
        "enqueue": _ENQUEUE,
        "claim": _CLAIM,
        "claim_ids": _CLAIM_IDS,
        "reap": _REAP,
        "heartbeat": _HEARTBEAT,
        "mark_alone": _MARK_ALONE,
        "complete": _COMPLETE,
        "fail": _FAIL,
        "release": _RELEASE,
        "cancel": _CANCEL,
        "requeue": _REQUEUE,
        "progress": _PROGRESS,
        "purge": _PURGE,
        "stats": _STATS,
    }.items()
}
