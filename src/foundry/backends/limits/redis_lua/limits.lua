-- Foundry's limits on Redis: one script, the command in ARGV[1] (see redis.py).
-- The clock is Redis's own (TIME), so every worker on every host shares one bucket.
--
-- acquire  KEYS = {bucket, slots}  ARGV = {"acquire", rate, burst, slots, holder, lease}
--          -> {1} granted | {0, wait seconds (string), "rate_limit" | "max_concurrency"}
-- renew    KEYS = {slots...}       ARGV = {"renew", lease, holder...} -> slots still held
-- release  KEYS = {slots}          ARGV = {"release", holder} -> 1 | 0
-- in_use   KEYS = {slots}          ARGV = {"in_use"} -> slots held now
-- tokens   KEYS = {bucket}         ARGV = {"tokens", rate, burst} -> tokens now (string)
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local cmd = ARGV[1]

local function level(bucket, rate, burst)
  local b = redis.call('HMGET', bucket, 'tokens', 'at')
  local tokens = tonumber(b[1]) or burst
  local at = tonumber(b[2]) or now
  return math.min(burst, tokens + math.max(0, now - at) * rate)
end

if cmd == 'acquire' then
  local rate, burst, slots = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local holder, lease = ARGV[5], tonumber(ARGV[6])
  if slots > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    if redis.call('ZSCORE', KEYS[2], holder) then
      redis.call('ZADD', KEYS[2], now + lease, holder)  -- held already: renewed, no token taken
      return {1}
    end
    if redis.call('ZCARD', KEYS[2]) >= slots then
      return {0, ARGV[7], 'max_concurrency'}
    end
  end
  if rate > 0 then
    local tokens = level(KEYS[1], rate, burst)
    if tokens < 1 then
      return {0, tostring((1 - tokens) / rate), 'rate_limit'}
    end
    redis.call('HSET', KEYS[1], 'tokens', tostring(tokens - 1), 'at', tostring(now))
    -- a full bucket is the same as none: let an idle scope's key go
    redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
  end
  if slots > 0 then
    redis.call('ZADD', KEYS[2], now + lease, holder)
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', KEYS[2], math.ceil(tonumber(last[2]) * 1000) + 1000)
  end
  return {1}
elseif cmd == 'renew' then
  local lease, n = tonumber(ARGV[2]), 0
  for i, key in ipairs(KEYS) do
    local holder = ARGV[i + 2]
    local until_ = tonumber(redis.call('ZSCORE', key, holder))
    if until_ and until_ > now then
      redis.call('ZADD', key, now + lease, holder)
      local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      redis.call('PEXPIREAT', key, math.ceil(tonumber(last[2]) * 1000) + 1000)
      n = n + 1
    end
  end
  return n
elseif cmd == 'release' then
  local until_ = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[2]))
  redis.call('ZREM', KEYS[1], ARGV[2])
  if until_ and until_ > now then return 1 end
  return 0
elseif cmd == 'in_use' then
  return redis.call('ZCOUNT', KEYS[1], '(' .. tostring(now), '+inf')
elseif cmd == 'tokens' then
  return tostring(level(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3])))
end
return redis.error_reply('foundry limits: unknown command ' .. tostring(cmd))
