--! include _lib.lua
-- KEYS[1] partition stream, KEYS[2] dead stream. ARGV: group, offset, then field/value pairs
if last_delivered(KEYS[1], ARGV[1]) == nil then return redis.error_reply('NOGROUP no such consumer group') end
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
-- a dead stream keeps about the last 100,000 dead letters
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 100000, '*', unpack(fields))
return ack_upto(KEYS[1], ARGV[1], ARGV[2])
