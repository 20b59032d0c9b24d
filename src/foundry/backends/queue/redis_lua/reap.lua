--! include _prelude.lua
-- ARGV: P, queue, now  -> {{id, priority}...} put back in the queue
return reap(ARGV[2], ARGV[3], true)
