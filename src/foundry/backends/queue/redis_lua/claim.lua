--! include _prelude.lua
-- ARGV: P, now, queue, worker, token, lease_until, limit
--   -> {jobs, next scheduled eta or '', next lease deadline or ''} (both '' when jobs were leased)
local now_s, q = ARGV[2], ARGV[3]
local rk, sk = Q(q, 'ready'), Q(q, 'sched')
reap(q, now_s, true)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', sk, '-inf', now_s, 'LIMIT', 0, 1000)) do
  redis.call('ZREM', sk, id)
  local f = redis.call('HMGET', J(id), 'status', 'priority', 'm')
  if f[1] == 'queued' then
    local priority = whole(f[2], -2147483647)
    if priority == nil then
      malformed(J(id), id, q, now_s, 'priority', f[2], 'is not an integer')
    elseif type(f[3]) ~= 'string' then
      malformed(J(id), id, q, now_s, 'm', f[3], 'is not a queue position')
    else
      redis.call('ZADD', rk, -priority, f[3])
    end
  end
end
local out, limit, empty, z = {}, tonumber(ARGV[7]), false, {}
while #out < limit do
  local want = limit - #out
  local popped = redis.call('ZPOPMIN', rk, want)
  for i = 1, #popped, 2 do
    local id = string.sub(popped[i], 30)
    local j = J(id)
    local f = lease_fields(j)
    if f[1] == 'queued' then
      local field, value, problem = unfit(f)
      if field then
        malformed(j, id, q, now_s, field, value, problem)
      else
        out[#out + 1] = lease_job(j, id, now_s, ARGV[4], ARGV[5], ARGV[6], f, z)
      end
    end
  end
  if #popped < 2 * want then  -- the ready set is empty: no second pop to find out
    empty = true
    break
  end
end
if #z > 0 then zmany('ZADD', Q(q, 'lease'), z) end
if empty or redis.call('ZCARD', rk) == 0 then redis.call('DEL', Q(q, 'wake')) end
if #out > 0 then return {out, '', ''} end  -- the deadlines only matter to a claimer about to block
local a = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')
local b = redis.call('ZRANGE', Q(q, 'lease'), 0, 0, 'WITHSCORES')
return {out, a[2] or '', b[2] or ''}
