--! include _keys.lua
-- ARGV: P, now, id, queue, unit, payload, codec, key, priority, eta, max_retries,
--       max_deliveries, timeout, result_ttl, trace  ->  1 (created), or {0, id of the job that exists}
-- (key, trace: '' when none; result_ttl: '' for the default, 7 days; none of the three is
-- then written, nor the fields a lease sets: the record is what the job needs, no more)
local now, id, q, key = ARGV[2], ARGV[3], ARGV[4], ARGV[8]
if key ~= '' then
  local other = redis.call('GET', P .. 'k:' .. key)
  if other then return {0, other} end
end
local j = J(id)
if redis.call('EXISTS', j) == 1 then return {0, id} end
local eta = ARGV[10]
local m = member(eta, id)
-- status first, then what a claim reads (lease_fields), in its order: a small hash is one
-- list that every HMGET and HSET walks from the front
local h = {'HSET', j, 'status', 'queued', 'unit', ARGV[5], 'payload', ARGV[6], 'codec', ARGV[7],
  'deliveries', '0', 'attempts', '0', 'max_retries', ARGV[11], 'max_deliveries', ARGV[12], 'timeout', ARGV[13],
  'enqueued_at', now, 'priority', ARGV[9], 'queue', q, 'm', m, 'eta', eta}
if key ~= '' then
  redis.call('SET', P .. 'k:' .. key, id)
  h[#h + 1] = 'key'
  h[#h + 1] = key
end
if ARGV[14] ~= '' then
  h[#h + 1] = 'result_ttl'
  h[#h + 1] = ARGV[14]
end
if ARGV[15] and ARGV[15] ~= '' then
  h[#h + 1] = 'trace'
  h[#h + 1] = ARGV[15]
end
redis.call(unpack(h))
if tonumber(eta) <= tonumber(now) then
  redis.call('ZADD', Q(q, 'ready'), -tonumber(ARGV[9]), m)
else
  redis.call('ZADD', Q(q, 'sched'), eta, id)
end
wake(q)
redis.call('SADD', P .. 'queues', q)
return 1
