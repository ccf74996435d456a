"""Where is a call? One consistent look at Redis for a set of awaited calls.

A call's message travels queue (a Redis list) → a worker's reservation (kombu's ``unacked``
hash, with ``task_acks_late``) → started (``Keys.started``, refreshed by the worker's heartbeat)
→ finished (``Keys.event``); where kombu keeps the first two, and how its messages decode, is
:mod:`toolfleet.dispatcher.infra.kombu_internals`. Every read of one look runs in a single
MULTI/EXEC, so a message moving between two places is seen in exactly one of them. The only way to
be seen *nowhere* is the window kombu leaves between popping a message and recording it in
``unacked`` (kombu #305/#1836): a message there is in transit, or lost if its worker died in that
window.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from toolfleet.broker.liveness import StartedMarker
from toolfleet.dispatcher.infra.kombu_internals import (
    decode_message,
    read_queued_and_reserved,
    split_queued_and_reserved,
)
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.tasks import EXECUTE_TASK

__all__ = ["NowhereTwice", "Place", "Sighting", "call_ids_of", "locate"]


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


@dataclass(slots=True)
class NowhereTwice:
    """Tells a call lost from one in transit: lost once it was found *nowhere* at two looks
    ``grace_s`` apart (kombu leaves a message nowhere for a moment between popping it and
    recording its reservation), with no look between them that found it somewhere.

    One per call, told the place of each look (:meth:`saw`). The reconciler republishes a
    call it says is lost, ``toolfleet recover`` records it never enqueued.
    """

    since_s: float | None = None  # when the current run of "nowhere" looks began

    def saw(self, place: str, now_s: float, grace_s: float) -> bool:
        """Note one look at the call (``Place``), taken at ``now_s``; True when it has now
        been found nowhere twice, ``grace_s`` apart."""
        if place != Place.NOWHERE:
            self.since_s = None
            return False
        if self.since_s is None:
            self.since_s = now_s
            return False
        return now_s - self.since_s >= grace_s

    def reset(self) -> None:
        """Start counting afresh (the call was sent again)."""
        self.since_s = None


def call_ids_of(raw: bytes | str) -> set[str]:
    """The call ids a kombu message carries: its task id (``call_id[.attempt]``) and, for a
    ``toolfleet.execute_many`` message, the call_id of every call in its body."""
    message = decode_message(raw)
    if message is None:
        return set()
    found: set[str] = set()
    if message.task_id is not None:
        found.add(message.task_id.split(".", 1)[0])
    if message.task_name != EXECUTE_TASK:
        found.update(_body_call_ids(message.body()))
    return found


def _body_call_ids(decoded: Any) -> set[str]:
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
        read_queued_and_reserved(pipe, queue_names)
        replies = await pipe.execute()
    records, markers = replies[0], replies[1]
    waiting, reservations = split_queued_and_reserved(replies[2:], queue_names)
    queued: dict[str, str] = {}
    for queue, messages in waiting.items():
        for raw in messages:
            for call_id in call_ids_of(raw):
                queued.setdefault(call_id, queue)
    reserved: set[str] = set()
    for raw in reservations:
        reserved.update(call_ids_of(raw))
    now = time.time() if now_s is None else now_s
    found: dict[str, Sighting] = {}
    for call_id, record, raw_marker in zip(call_ids, records, markers, strict=True):
        if record is not None:
            found[call_id] = Sighting(Place.FINISHED, record=record)
        elif raw_marker is not None and not (
            StartedMarker.from_json(raw_marker).is_stale(now)
            and call_id not in reserved
            and call_id not in queued
        ):
            marker = StartedMarker.from_json(raw_marker)
            age_s = now - marker.beat_at
            found[call_id] = Sighting(
                Place.STARTED, f"on {marker.worker}, heartbeat {age_s:.0f}s ago", marker=marker
            )
        elif raw_marker is not None and call_id not in reserved and call_id not in queued:
            # Its worker died while it ran and its message is gone (no redelivery is coming):
            # nobody will finish it. Found so twice, the reconciler republishes it once, and
            # the worker that takes it applies the worker-lost rules (bench/chaos.py:
            # one call of 2,000 left act() waiting forever on a dead worker's marker).
            marker = StartedMarker.from_json(raw_marker)
            found[call_id] = Sighting(
                Place.NOWHERE,
                f"started on {marker.worker}, heartbeat {now - marker.beat_at:.0f}s ago, "
                "its message gone",
                marker=marker,
            )
        elif call_id in reserved:
            found[call_id] = Sighting(Place.RESERVED, "by a worker, not yet started")
        elif call_id in queued:
            found[call_id] = Sighting(Place.QUEUED, f"on {queued[call_id]}")
        else:
            found[call_id] = Sighting(Place.NOWHERE)
    return found
