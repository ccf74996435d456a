"""The Lua scripts of the fleet-wide controls: a token bucket per rate limit, leased slots per
concurrency cap (:mod:`toolfleet.workers.limits` runs them).

Every script reads the clock of the Redis server (``TIME``), never a worker's: workers on
several hosts share one bucket and one set of leases, and their clocks need not agree.
"""

from __future__ import annotations

__all__ = ["SLOT_ACQUIRE_SCRIPT", "SLOT_RENEW_SCRIPT", "TOKEN_BUCKET_SCRIPT"]

# Scripts that write after TIME: effects replication (the default from Redis 5, the only mode
# from 7; redis.replicate_commands is gone in 7.2's strict mode, hence the pcall).
_CLOCK = """
pcall(function() redis.replicate_commands() end)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
"""

# KEYS: the bucket (hash: tokens, at). ARGV: tokens per second, bucket size, longest wait (s).
# A full bucket holds one second's worth (the burst). A call takes a token now, or reserves
# the next free one when it comes within the longest wait (the bucket goes below zero: later
# calls queue behind it, in order); otherwise nothing is taken. Returns {granted (1/0), wait}:
# granted, the seconds to wait before starting; refused, the seconds until a token is free.
# (A number crosses as a string: Lua numbers come back from Redis truncated to integers.)
TOKEN_BUCKET_SCRIPT = (
    _CLOCK
    + """
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
"""
)

# KEYS: the slots (sorted set: call id -> lease expiry). ARGV: cap, lease (s), call id.
# Lapsed leases are dropped first (a dead worker's slot comes back here); a call that holds a
# slot already (its redelivery, after the C7 take-over) keeps it. Returns 1 when the call
# holds a slot now, else 0. The key outlives its last lease by a second, so an abandoned set
# is gone even if no call comes to drop it.
SLOT_ACQUIRE_SCRIPT = (
    _CLOCK
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lease = tonumber(ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 1000) + 1000)
  return 1
end
return 0
"""
)

# KEYS: the slots. ARGV: lease (s), call id. The heartbeat's renewal: only a lease still held
# (XX; a lapsed one taken by another call stays taken). Returns 1 when renewed.
SLOT_RENEW_SCRIPT = (
    _CLOCK
    + """
local lease = tonumber(ARGV[1])
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease, ARGV[2]) == 1 then
  redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 1000) + 1000)
  return 1
end
return 0
"""
)
