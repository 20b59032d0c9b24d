--! include _lib.lua
-- KEYS[1] partition stream. ARGV: group, offset
if last_delivered(KEYS[1], ARGV[1]) == nil then return redis.error_reply('NOGROUP no such consumer group') end
return ack_upto(KEYS[1], ARGV[1], ARGV[2])
