-- A fleet-wide concurrency cap: the heartbeat's renewal of a call's slot lease.
-- KEYS[1] the slots (sorted set: call id -> lease expiry).
-- ARGV[1] lease (s); ARGV[2] call id.
-- Renews only a lease still held (XX; a lapsed one taken by another call stays taken).
-- Returns 1 when renewed, else 0.
-- Reads the clock of the Redis server (TIME), never a worker's: workers on several hosts
-- share one bucket and one set of leases, and their clocks need not agree. A script that
-- writes after TIME needs effects replication (the default from Redis 5, the only mode from
-- 7; redis.replicate_commands is gone in 7.2's strict mode, hence the pcall).
pcall(function() redis.replicate_commands() end)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local lease = tonumber(ARGV[1])
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease, ARGV[2]) == 1 then
  redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 1000) + 1000)
  return 1
end
return 0
