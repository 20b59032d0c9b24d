-- KEYS[1] partition stream. ARGV: group, consumer
local pend = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 10000, ARGV[2])
if #pend == 0 then return 0 end
local ids = {}
for i, e in ipairs(pend) do ids[i] = e[1] end
for i = 1, #ids, 1000 do
  local chunk = {}
  for j = i, math.min(i + 999, #ids) do chunk[#chunk + 1] = ids[j] end
  chunk[#chunk + 1] = 'JUSTID'
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, unpack(chunk))
end
return #ids
