-- The helpers that finish jobs (and read their fields), after the keys (``_keys.lua``,
-- which documents the layout): what the completion and the cancel scripts need.
--! include _keys.lua
-- f: the job's {result_ttl, key} when the caller already read them (else read here);
-- later: a batch's {fin = {score, member...}, lease = {queue = {id...}}} to add those to
-- (one ZADD and one ZREM per queue for the batch, by ``finish_later``), else written now
local function finish(j, id, q, now, f, later)
  f = f or redis.call('HMGET', j, 'result_ttl', 'key')
  local ttl = tonumber(f[1])
  if ttl == nil or ttl ~= ttl or ttl <= 0 or ttl > 3e9 then ttl = 604800 end  -- none or malformed: 7 days
  local exp = now + ttl
  local msn = math.floor(exp * 1000)
  local ms = string.format('%d', msn)
  local score = string.format('%d.%03d', math.floor(msn / 1000), msn % 1000)  -- the expiry, in seconds
  if later then
    local ids = later.lease[q]
    if not ids then
      ids = {}
      later.lease[q] = ids
    end
    ids[#ids + 1] = id
    later.fin[#later.fin + 1] = score
    later.fin[#later.fin + 1] = fin_member(q, id)
  else
    redis.call('ZREM', Q(q, 'lease'), id)
    redis.call('ZADD', P .. 'fin', score, fin_member(q, id))
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
  if type(v) == 'string' and #v == 1 then  -- one digit, the common case: no pattern, no strtod
    local n = string.byte(v) - 48
    if n >= 0 and n <= 9 and n >= low then return n end
    return nil
  end
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
