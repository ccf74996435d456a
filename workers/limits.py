"""Fleet-wide rate limits and concurrency caps, held in Redis by every worker.

A tool declared ``@tool(rate_limit="20/s", max_concurrency=4, limit_key="tenant")`` passes
two controls before it runs, after the call's C7 start (so a call waiting here is "started" to
the dispatcher's reconciler, and a redelivery of it waits for this one):

- the rate limit: a token bucket per scope in one script (``limit_token_bucket.lua``); a
  call takes a token, or reserves the next one and sleeps until it is due, or, when that is
  further off than its ``limit_wait_s``, takes nothing and fails RateLimitedError;
- the concurrency cap: a slot per running call in a sorted set scored by lease expiry
  (``limit_slot_acquire.lua``); the worker's heartbeat renews the lease while the call runs,
  so the slot of a worker SIGKILLed mid-call comes back when its lease lapses.

Waiting holds the worker slot running the call (a prefork process, or one of the asyncio
pool's coroutines), for at most the call's ``limit_wait_s``. A tool with neither control never
reaches this module: no Redis command is added to its path.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis

from toolfleet.broker.liveness import HEARTBEAT_STALE_S
from toolfleet.broker.outage import through_outage
from toolfleet.schemas.errors import RateLimitedError, WrongTypeError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.limits import LimitScope, limit_scope, limit_wait_of, retry_after_text
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage
from toolfleet.workers.limit_scripts import SLOT_ACQUIRE, TOKEN_BUCKET
from toolfleet.workers.store import Heartbeat

__all__ = [
    "SLOT_LEASE_S",
    "SLOT_RETRY_AFTER_S",
    "Held",
    "acquire_limits",
    "forget_slot",
    "limits_client",
    "release_limits",
]

# A slot's lease: renewed by the heartbeat every HEARTBEAT_INTERVAL_S, lapsed as the call's
# started marker goes stale (the worker is lost, toolfleet.broker.liveness).
SLOT_LEASE_S = HEARTBEAT_STALE_S
# What a caller refused a slot is told to wait: when a running call ends is not known.
SLOT_RETRY_AFTER_S = 1.0
# Between two tries for a slot: the first soon, then longer, never more than the cap.
_SLOT_POLL_FIRST_S = 0.02
_SLOT_POLL_MAX_S = 0.25


@dataclass(frozen=True, slots=True)
class Held:
    """What a call holds while it runs: its concurrency slot (None without a cap), and
    whether it had to wait for its limits (then it may have been stopped meanwhile)."""

    call_id: str
    slot_key: str | None
    waited: bool = False


def limits_client(store: object) -> aioredis.Redis:
    """The asyncio Redis client of a call's store (the single-call store's, or the batch's)."""
    client = getattr(store, "client", None)
    if not isinstance(client, aioredis.Redis):
        raise WrongTypeError(f"{type(store).__name__} has no asyncio Redis client for the limits")
    return client


async def acquire_limits(
    client: aioredis.Redis,
    keys: Keys,
    tool: Tool,
    msg: CallMessage,
    *,
    heartbeat: Heartbeat,
    outage_limit_s: float,
) -> Held:
    """Pass ``tool``'s rate limit, then take one of its concurrency slots, waiting at most the
    message's ``limit_wait_s`` in all; RateLimitedError (naming the limit, the scope and when
    to retry) otherwise. The slot, if any, is renewed by ``heartbeat`` from here on."""
    started = time.monotonic()
    budget_s = limit_wait_of(msg.limit_wait_s)
    scope = limit_scope(
        tool.limit_key, msg.arguments, branch_id=msg.branch_id, session_id=msg.session_id
    )
    waited = False
    if tool.rate_limit is not None:
        waited = await _pass_rate_limit(client, keys, tool, scope, budget_s, outage_limit_s)
    if tool.max_concurrency is None:
        return Held(msg.call_id, None, waited)
    slot_key = keys.slots(tool.function, scope.value)
    left_s = budget_s - (time.monotonic() - started)
    polled = await _take_slot(
        client, slot_key, tool, msg.call_id, scope, left_s, budget_s, outage_limit_s
    )
    heartbeat.lease(msg.call_id, slot_key)
    return Held(msg.call_id, slot_key, waited or polled)


async def release_limits(client: aioredis.Redis, held: Held, heartbeat: Heartbeat) -> None:
    """Give the call's slot back (its lease would lapse anyway, a few seconds later)."""
    if held.slot_key is None:
        return
    heartbeat.unlease(held.call_id)
    try:
        await client.zrem(held.slot_key, held.call_id)
    except redis.RedisError:
        pass  # the record is written; the lease lapses within SLOT_LEASE_S


async def forget_slot(client: aioredis.Redis, keys: Keys, tool: Tool, msg: CallMessage) -> None:
    """Drop the slot a lost worker held for ``msg``'s call (it will not be re-run here)."""
    if tool.max_concurrency is None:
        return
    scope = limit_scope(
        tool.limit_key, msg.arguments, branch_id=msg.branch_id, session_id=msg.session_id
    )
    try:
        await client.zrem(keys.slots(tool.function, scope.value), msg.call_id)
    except redis.RedisError:
        pass  # the lease lapses within SLOT_LEASE_S


async def _pass_rate_limit(
    client: aioredis.Redis,
    keys: Keys,
    tool: Tool,
    scope: LimitScope,
    budget_s: float,
    outage_limit_s: float,
) -> bool:
    """Take a token (False) or wait for the one reserved (True); RateLimitedError when it is
    further off than ``budget_s``."""
    rate = tool.rate_limit
    assert rate is not None
    key = keys.rate(tool.function, scope.value)
    args = [repr(rate.per_second), repr(rate.burst), repr(budget_s)]
    reply = await through_outage(
        lambda: TOKEN_BUCKET.run(client, keys=[key], args=args), outage_limit_s
    )
    granted, wait_s = int(reply[0]), float(reply[1])
    if not granted:
        raise RateLimitedError(
            f"call of tool {tool.function!r} not run: rate limit {rate.text}{scope.phrase()} "
            f"reached (the call may wait {budget_s:g} s, its limit_wait_s); retry after "
            f"{retry_after_text(wait_s)} s",
            retry_after_s=float(retry_after_text(wait_s)),
        )
    if wait_s <= 0:
        return False
    await asyncio.sleep(wait_s)
    return True


async def _take_slot(
    client: aioredis.Redis,
    slot_key: str,
    tool: Tool,
    call_id: str,
    scope: LimitScope,
    left_s: float,
    budget_s: float,
    outage_limit_s: float,
) -> bool:
    """Take a slot at once (False) or after waiting for one (True); RateLimitedError when
    none is free within ``left_s``."""
    cap = tool.max_concurrency
    args = [str(cap), repr(SLOT_LEASE_S), call_id]
    deadline = time.monotonic() + left_s
    pause_s = _SLOT_POLL_FIRST_S
    tries = 0
    while True:
        taken = await through_outage(
            lambda: SLOT_ACQUIRE.run(client, keys=[slot_key], args=args), outage_limit_s
        )
        tries += 1
        if int(taken) == 1:
            return tries > 1
        left = deadline - time.monotonic()
        if left <= 0:
            raise RateLimitedError(
                f"call of tool {tool.function!r} not run: concurrency cap {cap}{scope.phrase()} "
                f"reached ({cap} calls running; waited {budget_s:g} s, the call's "
                f"limit_wait_s); retry after {retry_after_text(SLOT_RETRY_AFTER_S)} s",
                retry_after_s=SLOT_RETRY_AFTER_S,
            )
        # Jittered, so waiters on several workers do not all ask at the same instant.
        await asyncio.sleep(min(left, pause_s * random.uniform(0.75, 1.25)))
        pause_s = min(pause_s * 1.5, _SLOT_POLL_MAX_S)
