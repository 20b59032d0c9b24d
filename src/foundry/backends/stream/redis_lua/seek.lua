--! include _lib.lua
-- KEYS[1] partition stream. ARGV: group, start id: drop the PEL, move the group
if last_delivered(KEYS[1], ARGV[1]) == nil then return redis.error_reply('NOGROUP no such consumer group') end
ack_upto(KEYS[1], ARGV[1], '18446744073709551615')
redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], ARGV[2])
return 1
