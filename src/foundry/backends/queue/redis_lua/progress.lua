--! include _keys.lua
-- ARGV: P, id, token, record -> 1 | 0 (the running delivery's progress, fenced by its token)
local j = J(ARGV[2])
local f = redis.call('HMGET', j, 'status', 'token')
if f[1] ~= 'running' or f[2] ~= ARGV[3] then return 0 end
redis.call('HSET', j, 'progress', ARGV[4])
return 1
