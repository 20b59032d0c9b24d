-- The Lua scripts of the Redis queue (``../redis.py``), one file per script, each beginning
-- with the helpers it needs: this file (``--! include _keys.lua``: the keys and the
-- enqueue's helpers), ``_finish.lua`` (these and the helpers that finish a job), or
-- ``_prelude.lua`` (all of them and those that lease jobs and reap lapsed leases). Redis
-- runs the included text on every call (each ``local function`` is a closure made anew),
-- so a script includes no more than it calls. Each runs atomically on the server,
-- so every state change of a job is one script: no other client ever sees half of it.
--
-- Keys under the prefix ``P`` (``ARGV[1]``, ending in ``:``):
--
-- ==========================  ===============================================================
-- ``P j:<id>``                hash: the job's whole record; a field at its default is not
--                             written (no ``id``: it is in the key; no ``token``, ``worker``,
--                             ``lease_until`` before the first lease; no ``key``, ``trace``,
--                             ``result_ttl`` when empty or 7 days), and reads take a missing
--                             one as that default
-- ``P k:<key>``               string: idempotency key -> job id (expires with the job)
-- ``P q:<queue>:ready``       zset: claimable jobs; score ``-priority``, member
--                             ``<eta µs, 17 digits><seq, 12 digits><id>`` (so equal scores sort
--                             by eta, then enqueue order: FIFO within a priority)
-- ``P q:<queue>:sched``       zset: delayed jobs and scheduled retries; score ``eta``
-- ``P q:<queue>:lease``       zset: leased jobs; score ``lease_until``
-- ``P q:<queue>:dead``        zset: dead letters of the queue; score ``finished_at``
-- ``P q:<queue>:wake``        list: wake-up tokens for claimers blocked in ``BLPOP``
-- ``P dead``                  zset: every dead letter; ``P fin``: finished jobs by expiry
-- ``P seq``, ``P queues``     enqueue counter; the set of queue names
-- ``P done`` (channel)        ``PUBLISH``-ed job ids when a job finishes (``wait``)
-- ``P cancel`` (channel)      ``PUBLISH``-ed job ids when a running job's cancel is requested
-- ==========================  ===============================================================
--
-- A running job whose cancel was requested has the field ``cancel_at``; every script that
-- ends a delivery (complete, fail, release, a lapsed lease) then writes ``cancelled``.
--
-- Keys are computed inside the scripts, so a Redis Cluster needs the whole prefix in one
-- hash slot: use a hash-tagged prefix such as ``{foundry}``.

local P = ARGV[1]
local function J(id) return P .. 'j:' .. id end
local function Q(q, s) return P .. 'q:' .. q .. ':' .. s end
-- Numbers become text with '%d' (integer formatting) wherever they are whole: Lua's own
-- number-to-string ('%.14g', and '%.0f') goes through the C library's floating-point
-- printf, several times the cost, and it ran several times per job.
local function member(eta, id)
  local seq = redis.call('INCR', P .. 'seq')
  local us = math.floor(tonumber(eta) * 1000000 + 0.5)
  if us < 0 then us = 0 elseif us > 9e15 then us = 9e15 end
  return string.format('%017d%012d', us, seq) .. id
end
local function fin_member(q, id) return string.format('%03d', #q) .. q .. id end
local function wake(q)  -- one call; a list grown past 64 tokens is cut to 32 (once in 32 pushes)
  local w = Q(q, 'wake')
  if redis.call('RPUSH', w, '1') > 64 then redis.call('LTRIM', w, 0, 31) end
end
-- One variadic call for many members (score, member, score, member ...), in chunks that
-- stay inside Lua's stack for unpack.
local function zmany(cmd, key, items)
  for i = 1, #items, 1000 do
    redis.call(cmd, key, unpack(items, i, math.min(i + 999, #items)))
  end
end
