"""Where is a call? One consistent look at Redis for a set of awaited calls (issue 12 item 2).

A call's message travels queue (a Redis list) → a worker's reservation (kombu's ``unacked``
hash, with ``task_acks_late``) → started (``Keys.started``, refreshed by the worker's heartbeat)
→ finished (``Keys.event``). Every read of one look runs in a single MULTI/EXEC, so a message
moving between two places is seen in exactly one of them. The only way to be seen *nowhere*
is the window kombu leaves between popping a message and recording it in ``unacked`` (kombu
#305/#1836): a message there is in transit, or lost if its worker died in that window.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from schemas.keys import Keys
from schemas.liveness import StartedMarker

__all__ = ["UNACKED_KEY", "Place", "Sighting", "call_ids_of", "locate"]

# kombu's Redis transport keeps every reserved (not yet acknowledged) message in this hash.
UNACKED_KEY = "unacked"


class Place:
    """Where a call was found; plain strings so they read well in an error message."""

    QUEUED = "queued"
    RESERVED = "reserved"
    STARTED = "started"
    FINISHED = "finished"
    NOWHERE = "nowhere"


@dataclass(frozen=True, slots=True)
class Sighting:
    """One call's place at one look, with what the place said about it."""

    place: str
    detail: str = ""
    record: bytes | None = None  # the terminal record, when FINISHED
    marker: StartedMarker | None = None  # the started marker, when STARTED

    def describe(self) -> str:
        return f"{self.place} ({self.detail})" if self.detail else self.place


def call_ids_of(raw: bytes | str) -> set[str]:
    """The call ids a kombu message carries: its task id (``call_id[.attempt]``) and, for a
    ``toolfleet.execute_many`` message, the call_id of every call in its body."""
    try:
        payload = json.loads(raw)
        if isinstance(payload, list):  # an ``unacked`` entry: [message, exchange, routing_key]
            payload = payload[0]
        headers = payload.get("headers") or {}
    except (ValueError, AttributeError, IndexError, TypeError):
        return set()
    found: set[str] = set()
    task_id = headers.get("id")
    if isinstance(task_id, str):
        found.add(task_id.split(".", 1)[0])
    if headers.get("task") != "toolfleet.execute":
        found.update(_body_call_ids(payload))
    return found


def _body_call_ids(payload: dict[str, Any]) -> set[str]:
    body: Any = payload.get("body")
    if not isinstance(body, str | bytes):
        return set()
    try:
        if payload.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        decoded = json.loads(body)
    except (ValueError, TypeError):
        return set()
    found: set[str] = set()
    stack: list[Any] = [decoded]
    depth = 0
    while stack and depth < 10_000:  # bounded: a hostile body cannot make this spin
        item = stack.pop()
        depth += 1
        if isinstance(item, dict):
            call_id = item.get("call_id")
            if isinstance(call_id, str):
                found.add(call_id)
            stack.extend(v for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, dict | list))
    return found


async def locate(
    client: aioredis.Redis,
    keys: Keys,
    call_ids: Sequence[str],
    queues: Iterable[str],
    *,
    now_s: float | None = None,
) -> dict[str, Sighting]:
    """Where each of ``call_ids`` is, read in one MULTI/EXEC (a consistent snapshot)."""
    if not call_ids:
        return {}
    queue_names = sorted(set(queues))
    async with client.pipeline(transaction=True) as pipe:
        pipe.mget([keys.event(c) for c in call_ids])
        pipe.mget([keys.started(c) for c in call_ids])
        for queue in queue_names:
            pipe.lrange(queue, 0, -1)
        pipe.hvals(UNACKED_KEY)
        replies = await pipe.execute()
    records, markers = replies[0], replies[1]
    queued: dict[str, str] = {}
    for queue, messages in zip(queue_names, replies[2:-1], strict=True):
        for raw in messages:
            for call_id in call_ids_of(raw):
                queued.setdefault(call_id, queue)
    reserved: set[str] = set()
    for raw in replies[-1]:
        reserved.update(call_ids_of(raw))
    now = time.time() if now_s is None else now_s
    found: dict[str, Sighting] = {}
    for call_id, record, raw_marker in zip(call_ids, records, markers, strict=True):
        if record is not None:
            found[call_id] = Sighting(Place.FINISHED, record=record)
        elif raw_marker is not None:
            marker = StartedMarker.from_json(raw_marker)
            age_s = now - marker.beat_at
            found[call_id] = Sighting(
                Place.STARTED, f"on {marker.worker}, heartbeat {age_s:.0f}s ago", marker=marker
            )
        elif call_id in reserved:
            found[call_id] = Sighting(Place.RESERVED, "by a worker, not yet started")
        elif call_id in queued:
            found[call_id] = Sighting(Place.QUEUED, f"on {queued[call_id]}")
        else:
            found[call_id] = Sighting(Place.NOWHERE)
    return found
