--! include _prelude.lua
-- ARGV: P, queue, now, worker, token, lease_until, id...  -> {claimed jobs, {id, status, eta}...}
-- (the AMQP engine: the broker chose these jobs; lease those still queued and due)
local q, now_s = ARGV[2], ARGV[3]
local now = tonumber(now_s)
local out, other, z = {}, {}, {}
for i = 7, #ARGV do
  local id = ARGV[i]
  local j = J(id)
  local f = redis.call('HMGET', j, 'status', 'eta', 'queue', 'm')
  local field, value, problem, g = nil, nil, nil, nil
  if f[1] == 'queued' and f[3] == q then
    if not finite(f[2]) then
      field, value, problem = 'eta', f[2], 'is not a finite number'
    else
      g = lease_fields(j)
      field, value, problem = unfit(g)
    end
    if field then
      if f[4] then redis.call('ZREM', Q(q, 'ready'), f[4]) end
      redis.call('ZREM', Q(q, 'sched'), id)
      malformed(j, id, q, now_s, field, value, problem)
      f[1] = 'dead'
    end
  end
  if f[1] == 'queued' and f[3] == q and finite(f[2]) <= now then
    if f[4] then redis.call('ZREM', Q(q, 'ready'), f[4]) end
    redis.call('ZREM', Q(q, 'sched'), id)
    out[#out + 1] = lease_job(j, id, now_s, ARGV[4], ARGV[5], ARGV[6], g, z)
  else
    other[#other + 1] = {id, f[1] or '', f[2] or ''}
  end
end
if #z > 0 then zmany('ZADD', Q(q, 'lease'), z) end
return {out, other}
