--! include _keys.lua
-- ARGV: P, now, limit -> {purged, looked at}
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
