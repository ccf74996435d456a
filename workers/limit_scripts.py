"""The Lua scripts of the fleet-wide controls: a token bucket per rate limit, leased slots per
concurrency cap (:mod:`toolfleet.workers.limits` runs them).

Every script reads the clock of the Redis server (``TIME``), never a worker's: workers on
several hosts share one bucket and one set of leases, and their clocks need not agree.
"""

from __future__ import annotations

from toolfleet.broker.lua_scripts import lua_script

__all__ = [
    "SLOT_ACQUIRE",
    "SLOT_ACQUIRE_SCRIPT",
    "SLOT_RENEW",
    "SLOT_RENEW_SCRIPT",
    "TOKEN_BUCKET",
    "TOKEN_BUCKET_SCRIPT",
]

# The scripts, as files of toolfleet/broker/lua/ (each file's header: its KEYS and ARGV),
# read once: the token bucket of a rate limit, taking and renewing a slot's lease.
TOKEN_BUCKET = lua_script("limit_token_bucket")
SLOT_ACQUIRE = lua_script("limit_slot_acquire")
SLOT_RENEW = lua_script("limit_slot_renew")
TOKEN_BUCKET_SCRIPT = TOKEN_BUCKET.source
SLOT_ACQUIRE_SCRIPT = SLOT_ACQUIRE.source
SLOT_RENEW_SCRIPT = SLOT_RENEW.source
