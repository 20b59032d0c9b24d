--! include _lib.lua
-- KEYS[1] meta, KEYS[2] partition stream. ARGV: partition, age cutoff ('' none), max bytes ('' none)
local last = tonumber(redis.call('HGET', KEYS[1], 'last:' .. ARGV[1]) or '0')
local cum = tonumber(redis.call('HGET', KEYS[1], 'cum:' .. ARGV[1]) or '0')
local first = first_offset(KEYS[2], last)
if first > last then return 0 end
local cut = first - 1
if ARGV[2] ~= '' then cut = math.max(cut, last_below(KEYS[2], first, last, 't', tonumber(ARGV[2]))) end
if ARGV[3] ~= '' and cum > tonumber(ARGV[3]) then
  cut = math.max(cut, last_below(KEYS[2], first, last, 'c', cum - tonumber(ARGV[3]) + 1))
end
if cut < first then return 0 end
return redis.call('XTRIM', KEYS[2], 'MINID', fmt(cut + 1) .. '-0')
