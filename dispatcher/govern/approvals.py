"""Approvals that survive restarts: park a call in Redis, decide it from anywhere, wait for it.

A call that needs approval (its tool says ``approval=True``; a gate returned
:class:`Escalate`; a TOOL_PRE hook raised ``ApprovalRequired``) is parked before it is
enqueued: it holds no worker slot, and the batch's other calls go on. Whoever can reach the
broker decides it, exactly once (``toolfleet.dispatcher.govern.approvals.DECIDE``); the waiting
dispatcher polls the call's hash, bounded by the call's approval time. Everything lives in
Redis, so a dispatcher that dies while calls wait leaves them decidable for
``toolfleet recover`` (``toolfleet.dispatcher.history.recover``).
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from toolfleet.broker.lua_scripts import lua_script
from toolfleet.schemas.approval import ApprovalRequest, ApprovalState
from toolfleet.schemas.errors import ApprovalNotWaitingError, ConfigurationError
from toolfleet.schemas.keys import Keys

__all__ = [
    "ApprovalHandler",
    "Escalate",
    "approval_hashes",
    "approve",
    "decide",
    "default_decider",
    "deny",
    "expire",
    "load_approval",
    "park",
    "wait_for_decision",
    "waiting_approvals",
]

log = logging.getLogger(__name__)

# A handler gets each parked call; True approves, False denies, None leaves it to others.
# The scripts that park a call and decide it, read once from toolfleet/broker/lua/ (their
# KEYS and ARGV: the files' headers).
PARK = lua_script("approval_park")
DECIDE = lua_script("approval_decide")

ApprovalHandler = Callable[[ApprovalRequest], "bool | Awaitable[bool | None] | None"]

# How often a waiting dispatcher reads the call's hash: soon at first (a handler or a quick
# person), then at most twice a second, so a thousand waiting calls cost 2,000 reads a second.
_FIRST_POLL_S = 0.02
_MAX_POLL_S = 0.5


@dataclass(frozen=True, slots=True)
class Escalate:
    """What a session gate returns to have the call approved before it runs (instead of a
    plain yes or no); ``reason`` is shown to whoever decides."""

    reason: str = "a gate asked for approval"


def default_decider() -> str:
    """Who decides when no name is given: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


async def park(
    client: aioredis.Redis,
    keys: Keys,
    request: ApprovalRequest,
    *,
    message: str,
    route: Mapping[str, Any],
    ttl_s: int,
) -> ApprovalRequest | None:
    """Write the parked call and list it as waiting, in one script; None when it is new.

    A call parked before under the same call_id (a replay of the model's tool_call_id on the
    branch, or its batch run again) is not asked twice: that earlier request, waiting or
    decided, is returned instead. The hash outlives its approval time by ``ttl_s`` (the
    records' TTL), so its decision can still be read.
    """
    expire_s = max(1, int(request.expires_at - time.time()) + ttl_s)
    fields = request.to_fields(message=message, route=route)
    created = await PARK.run(
        client,
        keys=[keys.approval(request.call_id), keys.approvals()],
        args=[
            request.call_id,
            expire_s,
            repr(request.requested_at),
            *[part for pair in fields.items() for part in pair],
        ],
    )
    if created:
        return None
    return await load_approval(client, keys, request.call_id)


async def load_approval(client: aioredis.Redis, keys: Keys, call_id: str) -> ApprovalRequest | None:
    raw = await client.hgetall(keys.approval(call_id))
    return ApprovalRequest.from_fields(raw) if raw else None


async def approval_hashes(
    client: aioredis.Redis, keys: Keys, call_ids: list[str]
) -> list[Mapping[bytes | str, bytes | str]]:
    """The parked-call hash of each of ``call_ids``, in one round trip (empty: none)."""
    if not call_ids:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for call_id in call_ids:
            pipe.hgetall(keys.approval(call_id))
        found: list[Mapping[bytes | str, bytes | str]] = await pipe.execute()
    return found


async def waiting_approvals(client: aioredis.Redis, keys: Keys) -> list[ApprovalRequest]:
    """Every call waiting for approval, oldest first."""
    listed = await client.zrange(keys.approvals(), 0, -1)
    call_ids = [c.decode() if isinstance(c, bytes) else str(c) for c in listed]
    found = await approval_hashes(client, keys, call_ids)
    waiting: list[ApprovalRequest] = []
    gone: list[str] = []
    for call_id, raw in zip(call_ids, found, strict=True):
        request = ApprovalRequest.from_fields(raw) if raw else None
        if request is None or not request.waiting:
            gone.append(call_id)  # its hash expired, or a decision raced the listing
        else:
            waiting.append(request)
    if gone:
        await client.zrem(keys.approvals(), *gone)
    return waiting


async def decide(
    client: aioredis.Redis,
    keys: Keys,
    call_id: str,
    state: ApprovalState,
    *,
    by: str,
    reason: str | None = None,
) -> ApprovalRequest:
    """Approve, deny or expire a waiting call; returns it decided. The first decision wins:
    ApprovalNotWaitingError when the call is unknown or was already decided (it says by whom)."""
    if state == "waiting":
        raise ConfigurationError("decide() needs 'approved', 'denied' or 'expired', not 'waiting'")
    answer: list[bytes | str] = await DECIDE.run(
        client,
        keys=[keys.approval(call_id), keys.approvals()],
        args=[call_id, state, by, reason or ""],
    )
    verdict = [part.decode() if isinstance(part, bytes) else str(part) for part in answer]
    if verdict[0] == "missing":
        raise ApprovalNotWaitingError(
            f"no call {call_id!r} is waiting for approval (unknown id, or decided long ago and "
            "forgotten); `toolfleet approvals` lists the calls that wait, with their ids"
        )
    if verdict[0] != "ok":
        raise ApprovalNotWaitingError(
            f"call {call_id!r} was already {verdict[0]} by {verdict[1] or 'someone'}; a call "
            "is decided once, and the first decision stands"
        )
    decided = await load_approval(client, keys, call_id)
    if decided is None:  # expired between the script and this read: the script's word
        raise ApprovalNotWaitingError(
            f"call {call_id!r} was {state} but its record has since expired"
        )
    return decided


async def approve(
    client: aioredis.Redis,
    keys: Keys,
    call_id: str,
    *,
    by: str | None = None,
    reason: str | None = None,
) -> ApprovalRequest:
    """Let the waiting call ``call_id`` run (``fleet.approve``); ApprovalNotWaitingError (an
    ApprovalError) when it is not waiting. Any process that reaches the broker may decide any
    waiting call, whoever parked it: a decision is a Redis write, read by the dispatcher that
    waits (docs/controls.md)."""
    return await decide(
        client, keys, call_id, "approved", by=by or default_decider(), reason=reason
    )


async def deny(
    client: aioredis.Redis, keys: Keys, call_id: str, reason: str, *, by: str | None = None
) -> ApprovalRequest:
    """Refuse the waiting call ``call_id`` (``fleet.deny``): it ends as a denial the model
    reads, with ``reason``; ApprovalNotWaitingError (an ApprovalError) when it is not waiting."""
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigurationError(
            f"deny() needs a reason, got {reason!r}; the model reads it, so say why "
            "(for example fleet.deny(call_id, 'only read-only queries today'))"
        )
    return await decide(client, keys, call_id, "denied", by=by or default_decider(), reason=reason)


async def wait_for_decision(
    client: aioredis.Redis, keys: Keys, request: ApprovalRequest
) -> ApprovalRequest:
    """Poll until ``request`` is decided or its ``expires_at`` passes (then it is expired
    here, unless a decision lands first). Always returns by ``expires_at`` plus one poll and
    one Redis timeout: a broker that cannot be read ends the wait as expired."""
    delay_s = _FIRST_POLL_S
    while True:
        remaining_s = request.expires_at - time.time()
        try:
            state = await client.hget(keys.approval(request.call_id), "state")
        except (redis.RedisError, OSError) as exc:
            log.warning("approval of call %s: broker unreadable: %r", request.call_id, exc)
            state = b"waiting"
        if state is None:
            return _expired(request, "timeout", "its approval record was lost from the broker")
        if state != b"waiting":
            return await load_approval(client, keys, request.call_id) or _expired(
                request, "timeout", "its approval record expired"
            )
        if remaining_s <= 0:
            waited_s = request.expires_at - request.requested_at
            return await expire(
                client, keys, request, by="timeout", why=f"no decision within {waited_s:g} s"
            )
        await asyncio.sleep(min(delay_s, remaining_s))
        delay_s = min(delay_s * 2, _MAX_POLL_S)


async def expire(
    client: aioredis.Redis, keys: Keys, request: ApprovalRequest, *, by: str, why: str
) -> ApprovalRequest:
    """End a call that still waits as expired, ``by`` whoever stopped waiting (``timeout``,
    ``cancel``, ``recover``), and return it decided. A decision that landed first stands;
    a broker that cannot be reached gets the expiry in memory only. Never raises for the
    broker."""
    try:
        return await decide(client, keys, request.call_id, "expired", by=by, reason=why)
    except ApprovalNotWaitingError:
        pass  # decided just now, or its record is gone: whatever Redis holds stands
    except (redis.RedisError, OSError):
        return _expired(request, by, why + " (the broker could not be reached to record it)")
    try:
        found = await load_approval(client, keys, request.call_id)
    except (redis.RedisError, OSError):
        found = None
    return found if found is not None and not found.waiting else _expired(request, by, why)


def _expired(request: ApprovalRequest, by: str, why: str) -> ApprovalRequest:
    return request.model_copy(
        update={
            "state": "expired",
            "decided_by": by,
            "decided_at": time.time(),
            "decision_reason": why,
        }
    )
