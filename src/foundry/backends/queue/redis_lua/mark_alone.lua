--! include _keys.lua
-- ARGV: P, id, token -> 1 | 0 (this delivery runs alone: a lapse now is charged to it)
local j = J(ARGV[2])
local f = redis.call('HMGET', j, 'status', 'token')
if f[1] ~= 'running' or f[2] ~= ARGV[3] then return 0 end
redis.call('HSET', j, 'alone', ARGV[3])
return 1
