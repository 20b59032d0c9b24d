-- KEYS[1] meta, KEYS[2] groups set, KEYS[3..] partition streams. ARGV: group, then start id per partition
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return 0 end
for i = 3, #KEYS do
  local ok, err = pcall(redis.call, 'XGROUP', 'CREATE', KEYS[i], ARGV[1], ARGV[i - 1], 'MKSTREAM')
  if not ok and not string.find(tostring(err), 'BUSYGROUP') then return redis.error_reply(tostring(err)) end
  if not ok then redis.call('XGROUP', 'SETID', KEYS[i], ARGV[1], ARGV[i - 1]) end
end
redis.call('SADD', KEYS[2], ARGV[1])
return 1
