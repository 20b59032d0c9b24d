--! include _keys.lua
-- ARGV: P, id, token, lease_until -> 1 | 0
local j = J(ARGV[2])
local f = redis.call('HMGET', j, 'status', 'token', 'queue')
if f[1] ~= 'running' or f[2] ~= ARGV[3] then return 0 end
redis.call('HSET', j, 'lease_until', ARGV[4])
redis.call('ZADD', Q(f[3], 'lease'), ARGV[4], ARGV[2])
return 1
