--! include _keys.lua
-- ARGV: P, now, queue -> {depth, scheduled, running, dead, oldest eta or ''}
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
