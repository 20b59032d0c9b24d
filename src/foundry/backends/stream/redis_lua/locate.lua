--! include _lib.lua
-- KEYS[1] meta, KEYS[2] partition stream. ARGV: partition, group ('' for none), time (or '')
-- -> {first, last, ts of first, offset of first entry at/after time, committed, pending, floor}
-- floor: the lowest offset a replay may ask for (1 when nothing was ever removed from the
-- partition: offsets below the first entry were never used — skipped past a foreign id)
local last = tonumber(redis.call('HGET', KEYS[1], 'last:' .. ARGV[1]) or '0')
local first = first_offset(KEYS[2], last)
local floor = first
if first > 1 then
  local ok, info = pcall(redis.call, 'XINFO', 'STREAM', KEYS[2])
  if not ok then info = {} end
  local added, length
  for j = 1, #info, 2 do
    if info[j] == 'entries-added' then added = info[j + 1] end
    if info[j] == 'length' then length = info[j + 1] end
  end
  if added ~= nil and added == length then floor = 1 end
end
local first_ts = 0
if first <= last then
  local _, ts = at_or_after(KEYS[2], first, last, 't')
  first_ts = ts or 0
end
local target = -1
if ARGV[3] ~= '' then target = last_below(KEYS[2], first, last, 't', tonumber(ARGV[3])) + 1 end
local committed, pending = -1, 0
if ARGV[2] ~= '' then
  local ld = last_delivered(KEYS[2], ARGV[2])
  if ld == nil then return redis.error_reply('NOGROUP no such consumer group') end
  committed = num(ld)
  local summary = redis.call('XPENDING', KEYS[2], ARGV[2])
  pending = summary[1]
  if pending > 0 then committed = num(summary[2]) - 1 end
end
return {
  fmt(first), fmt(last), string.format('%.6f', first_ts), fmt(target),
  fmt(committed), fmt(pending), fmt(floor)
}
