-- Functions the Lua scripts of the Redis stream (``../redis.py``) share: a script that
-- needs them begins with ``--! include _lib.lua``.
local MAXSEQ = '-18446744073709551615'
local function num(id) return tonumber(string.match(id, '^(%d+)')) end
local function fmt(n) return string.format('%d', n) end
local function last_delivered(key, group)
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', key)
  if not ok then return nil end
  for _, g in ipairs(groups) do
    local name, ld
    for j = 1, #g, 2 do
      if g[j] == 'name' then name = g[j + 1] elseif g[j] == 'last-delivered-id' then ld = g[j + 1] end
    end
    if name == group then return ld end
  end
  return nil
end
local function first_offset(key, last)
  local e = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)
  if #e == 0 then return last + 1 end
  return num(e[1][1])
end
local function field(entry, name)
  for j = 1, #entry[2], 2 do if entry[2][j] == name then return entry[2][j + 1] end end
  return nil
end
-- one string per entry ("<#m> <id> " .. m .. d, or "<#m>,<#t> <id> " .. m .. t .. d with
-- a trace context t): a fifth of the reply items to parse.
-- An entry without both fields (written by someone else) comes as {id, {fields}}: the
-- client hands it out as malformed, for the group to dead-letter, never drops it.
local function pack(entries)
  local out = {}
  for _, e in ipairs(entries) do
    local m, d, t = field(e, 'm'), field(e, 'd'), field(e, 't')
    if m and d and t then
      out[#out + 1] = #m .. ',' .. #t .. ' ' .. e[1] .. ' ' .. m .. t .. d
    elseif m and d then
      out[#out + 1] = #m .. ' ' .. e[1] .. ' ' .. m .. d
    else
      out[#out + 1] = {e[1], e[2]}
    end
  end
  return out
end
-- entry field m = "<ts> <cumulative bytes> <#id> <k|->" .. id .. key.
-- The offset and the `name` value (t: ts, c: cum) of the first of Foundry's entries in
-- [off, hi] (foreign entries, without a readable m, are passed over); nil if none.
local function at_or_after(key, off, hi, name)
  local entries = redis.call('XRANGE', key, fmt(off) .. '-0', fmt(hi) .. MAXSEQ, 'COUNT', 8)
  for _, e in ipairs(entries) do
    local m = field(e, 'm')
    if m then
      local ts, cum = string.match(m, '^(%S+) (%S+)')
      local v = tonumber(name == 't' and (ts or '') or (cum or ''))
      if v then return num(e[1]), v end
    end
  end
  return nil
end
-- the largest offset in [lo, hi] whose `name` (t or c) is < value (lo - 1 if none); the
-- offsets may have holes (an append after a foreign entry skips past its id)
local function last_below(key, lo, hi, name, value)
  local answer = lo - 1
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local o, v = at_or_after(key, mid, hi, name)
    if o == nil or v >= value then hi = mid - 1 else answer = o; lo = o + 1 end
  end
  return answer
end
-- every pending id of `group` at or below offset `upto` (whatever the sequence part: a
-- foreign entry's id may have one)
local function ack_upto(key, group, upto)
  local total = 0
  while true do
    local pend = redis.call('XPENDING', key, group, '-', upto .. MAXSEQ, 1000)
    if #pend == 0 then return total end
    local ids = {}
    for i, e in ipairs(pend) do ids[i] = e[1] end
    redis.call('XACK', key, group, unpack(ids))
    total = total + #ids
    if #pend < 1000 then return total end
  end
end
