--! include _lib.lua
-- KEYS[1] partition stream. ARGV: group, consumer, max, ack ms
local key, group, consumer, max, ack = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local pend = redis.call('XPENDING', key, group, '-', '+', max)
if #pend > 0 then
  local ids, counts = {}, {}
  for i, e in ipairs(pend) do
    if e[3] < ack then break end
    ids[i] = e[1]; counts[i] = e[4]
  end
  if #ids == 0 then return {'wait'} end
  local r = redis.call('XAUTOCLAIM', key, group, consumer, ack, ids[1], 'COUNT', #ids)
  return {'claimed', pack(r[2]), r[3] or {}, ids, counts}
end
local ld = last_delivered(key, group)
if ld == nil then return redis.error_reply('NOGROUP no such consumer group') end
local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', max, 'STREAMS', key, '>')
if not r then return {'new', {}, ld} end
return {'new', pack(r[1][2]), ld}
