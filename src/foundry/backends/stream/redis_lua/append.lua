--! include _lib.lua
-- KEYS[1] meta hash. ARGV: tag, now, dedup ms, maxlen, events. `events` packs each event as
-- >H partition, >I len + blob, >I len + payload (one argument: packing thousands of
-- arguments costs the client more than the whole script costs the server), where
-- blob = "<#id> <k|->" .. id .. key, the tail of the entry's m field.
-- Returns {partition, first new offset, ...}, {event index, "<partition>:<offset>", ...}
-- for the duplicates and {event index, offset, ...} for the events placed past a foreign
-- entry's id (not at the previous offset + 1); the client numbers the others itself.
local tag, now, dedup, maxlen = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local data = ARGV[5]
local parts, blobs, payloads, traces, ids = {}, {}, {}, {}, {}
local pos, size = 1, #data
while pos <= size do
  local p, blob, payload, trace
  p, blob, payload, trace, pos = struct.unpack('>HI4c0I4c0I4c0', data, pos)
  parts[#parts + 1], blobs[#blobs + 1], payloads[#payloads + 1] = tostring(p), blob, payload
  traces[#traces + 1] = trace
  local n, rest = string.match(blob, '^(%d+) (.*)$')
  ids[#ids + 1] = string.sub(rest, 2, 1 + tonumber(n))
end
-- Dedup: event ids live in hashes per time bucket of `dedup` ms; an id is found in the
-- current or the previous bucket, so it is remembered for between one and two windows.
local seen, fresh_ids, dups = {}, {}, {}
local cur, prev
if dedup > 0 then
  local bucket = math.floor(now * 1000 / dedup)
  cur, prev = tag .. ':ids:' .. fmt(bucket), tag .. ':ids:' .. fmt(bucket - 1)
  for c = 1, #ids, 1000 do
    local chunk = {}
    for j = c, math.min(c + 999, #ids) do chunk[#chunk + 1] = ids[j] end
    local a = redis.call('HMGET', cur, unpack(chunk))
    local b = redis.call('HMGET', prev, unpack(chunk))
    for j = 1, #chunk do
      local hit = a[j] or b[j]
      if hit and seen[chunk[j]] == nil then seen[chunk[j]] = hit end
    end
  end
end
-- XADD at offset `off`, or just past a higher id someone else put in the partition (an
-- XADD with '*' outside Foundry): the offset it got
local function xadd(key, maxlen, off, m, payload, trace)
  local fields = {'m', m, 'd', payload}
  if trace ~= '' then fields[5], fields[6] = 't', trace end  -- the W3C trace context, when traced
  for _ = 1, 2 do
    local ok, err
    if maxlen > 0 then
      ok, err = pcall(redis.call, 'XADD', key, 'MAXLEN', maxlen, fmt(off) .. '-0', unpack(fields))
    else
      ok, err = pcall(redis.call, 'XADD', key, fmt(off) .. '-0', unpack(fields))
    end
    if ok then return off end
    local info = redis.call('XINFO', 'STREAM', key)
    local top = nil
    for j = 1, #info, 2 do if info[j] == 'last-generated-id' then top = num(info[j + 1]) end end
    if top == nil or top < off then error(err) end
    off = top + 1
  end
  return redis.error_reply('ERR could not append past the foreign entries of ' .. key)
end
local last, lts, stamp, cum, firsts, jumps = {}, {}, {}, {}, {}, {}
for k = 1, #parts do
  local p, blob, payload = parts[k], blobs[k], payloads[k]
  if last[p] == nil then
    local m = redis.call('HMGET', KEYS[1], 'last:' .. p, 'ts:' .. p, 'cum:' .. p)
    last[p], lts[p], cum[p] = tonumber(m[1] or '0'), tonumber(m[2] or '0'), tonumber(m[3] or '0')
    if now > lts[p] then lts[p] = now end
    stamp[p] = string.format('%.6f', lts[p])
    firsts[#firsts + 1] = tonumber(p)
    firsts[#firsts + 1] = last[p] + 1
  end
  local hit = dedup > 0 and seen[ids[k]]
  if hit then
    dups[#dups + 1] = k - 1
    dups[#dups + 1] = hit
  else
    local off = last[p] + 1
    cum[p] = cum[p] + #payload
    local m = stamp[p] .. ' ' .. fmt(cum[p]) .. ' ' .. blob
    local placed = xadd(tag .. ':p:' .. p, maxlen, off, m, payload, traces[k])
    if placed ~= off then
      jumps[#jumps + 1] = k - 1
      jumps[#jumps + 1] = placed
      off = placed
    end
    last[p] = off
    if dedup > 0 then
      local where = p .. ':' .. fmt(off)
      seen[ids[k]] = where
      fresh_ids[#fresh_ids + 1] = ids[k]
      fresh_ids[#fresh_ids + 1] = where
    end
  end
end
for c = 1, #fresh_ids, 1000 do
  redis.call('HSET', cur, unpack(fresh_ids, c, math.min(c + 999, #fresh_ids)))
end
if #fresh_ids > 0 then redis.call('PEXPIRE', cur, 2 * dedup + 1000) end
for p, v in pairs(last) do
  redis.call('HSET', KEYS[1], 'last:' .. p, fmt(v), 'ts:' .. p, stamp[p], 'cum:' .. p, fmt(cum[p]))
end
return {firsts, dups, jumps}
