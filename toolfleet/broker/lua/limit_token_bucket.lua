-- A fleet-wide rate limit: the token bucket of one scope.
-- KEYS[1] the bucket (hash: tokens, at).
-- ARGV[1] tokens per second; ARGV[2] bucket size; ARGV[3] longest wait (s).
-- A full bucket holds one second's worth (the burst). A call takes a token now, or reserves
-- the next free one when it comes within the longest wait (the bucket goes below zero: later
-- calls queue behind it, in order); otherwise nothing is taken. Returns {granted (1/0), wait}:
-- granted, the seconds to wait before starting; refused, the seconds until a token is free.
-- (A number crosses as a string: Lua numbers come back from Redis truncated to integers.)
-- Reads the clock of the Redis server (TIME), never a worker's: workers on several hosts
-- share one bucket and one set of leases, and their clocks need not agree. A script that
-- writes after TIME needs effects replication (the default from Redis 5, the only mode from
-- 7; redis.replicate_commands is gone in 7.2's strict mode, hence the pcall).
pcall(function() redis.replicate_commands() end)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil then
  tokens = burst
  at = now
end
if now > at then
  tokens = math.min(burst, tokens + (now - at) * rate)
  at = now
end
local wait = 0
if tokens < 1 then wait = (1 - tokens) / rate end
if wait > tonumber(ARGV[3]) then return {0, tostring(wait)} end
tokens = tokens - 1
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(at))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {1, tostring(wait)}
