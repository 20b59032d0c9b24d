--! include _prelude.lua
-- ARGV: P, now, id, queue, unit, payload, codec, key, priority, eta, max_retries,
--       max_deliveries, timeout, result_ttl, trace  ->  1 (created), or {0, id of the job that exists}
local now, id, q, key = ARGV[2], ARGV[3], ARGV[4], ARGV[8]
if key ~= '' then
  local other = redis.call('GET', P .. 'k:' .. key)
  if other then return {0, other} end
end
local j = J(id)
if redis.call('EXISTS', j) == 1 then return {0, id} end
if key ~= '' then redis.call('SET', P .. 'k:' .. key, id) end
local eta = ARGV[10]
local m = member(eta, id)
redis.call('HSET', j, 'id', id, 'queue', q, 'unit', ARGV[5], 'payload', ARGV[6], 'codec', ARGV[7],
  'key', key, 'priority', ARGV[9], 'eta', eta, 'status', 'queued', 'token', '', 'worker', '',
  'lease_until', '0', 'deliveries', '0', 'attempts', '0', 'max_retries', ARGV[11],
  'max_deliveries', ARGV[12], 'timeout', ARGV[13], 'result_ttl', ARGV[14], 'enqueued_at', now, 'm', m,
  'trace', ARGV[15] or '')
if tonumber(eta) <= tonumber(now) then
  redis.call('ZADD', Q(q, 'ready'), -tonumber(ARGV[9]), m)
else
  redis.call('ZADD', Q(q, 'sched'), eta, id)
end
wake(q)
redis.call('SADD', P .. 'queues', q)
return 1
