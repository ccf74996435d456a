-- A fleet-wide concurrency cap: takes a leased slot for one call.
-- KEYS[1] the slots (sorted set: call id -> lease expiry).
-- ARGV[1] cap; ARGV[2] lease (s); ARGV[3] call id.
-- Lapsed leases are dropped first (a dead worker's slot comes back here); a call that holds a
-- slot already (its redelivery, after the C7 take-over) keeps it. Returns 1 when the call
-- holds a slot now, else 0. The key outlives its last lease by a second, so an abandoned set
-- is gone even if no call comes to drop it.
-- Reads the clock of the Redis server (TIME), never a worker's: workers on several hosts
-- share one bucket and one set of leases, and their clocks need not agree. A script that
-- writes after TIME needs effects replication (the default from Redis 5, the only mode from
-- 7; redis.replicate_commands is gone in 7.2's strict mode, hence the pcall).
pcall(function() redis.replicate_commands() end)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lease = tonumber(ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 1000) + 1000)
  return 1
end
return 0
