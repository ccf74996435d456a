"""How a worker and a call show they are alive, as both sides read it in Redis.

A call a worker runs has a started marker (``Keys.started(call_id)``) whose heartbeat the
worker refreshes; a marker older than ``HEARTBEAT_STALE_S`` belongs to a worker that died or
froze mid-call (C7). A worker beats its queues into ``Keys.workers(queue)``; a beat older than
``PRESENCE_STALE_S`` no longer counts as a live consumer. A worker whose task events a monitor
turned on holds a lease in ``Keys.monitor()`` (toolfleet.workers.monitor); while one is live, a
monitor watches (:class:`MonitorWatch`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HEARTBEAT_STALE_S",
    "PRESENCE_STALE_S",
    "WATCH_CACHE_S",
    "MonitorWatch",
    "StartedMarker",
    "live_leases",
    "live_since",
]

# A started marker not refreshed for this long belongs to a worker that died (or froze).
HEARTBEAT_STALE_S = 8.0
# Several missed presence beats: a loaded machine delays a beat, a dead worker misses all.
PRESENCE_STALE_S = 10.0
# How long an answer to "does a monitor watch?" stands: one HGETALL a second, not one per call.
WATCH_CACHE_S = 1.0


def live_since(now_s: float | None = None) -> float:
    """The oldest presence beat (epoch seconds) that still counts as a live worker."""
    return (time.time() if now_s is None else now_s) - PRESENCE_STALE_S


@dataclass(frozen=True, slots=True)
class StartedMarker:
    """Who runs a call: worker hostname, pid, attempt, and the last heartbeat (epoch seconds)."""

    worker: str
    pid: int
    attempt: int
    beat_at: float

    def to_json(self) -> str:
        return json.dumps(
            {
                "worker": self.worker,
                "pid": self.pid,
                "attempt": self.attempt,
                "beat_at": self.beat_at,
            }
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> StartedMarker:
        try:
            data = json.loads(raw)
            return cls(
                worker=str(data["worker"]),
                pid=int(data["pid"]),
                attempt=int(data["attempt"]),
                beat_at=float(data["beat_at"]),
            )
        except (ValueError, KeyError, TypeError):
            # An unreadable marker is treated as stale: its writer cannot be vouched for.
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            return cls(worker=text, pid=0, attempt=0, beat_at=0.0)

    @classmethod
    def now(cls, worker: str, attempt: int) -> StartedMarker:
        return cls(worker=worker, pid=os.getpid(), attempt=attempt, beat_at=time.time())

    def is_stale(self, now_s: float | None = None) -> bool:
        return ((time.time() if now_s is None else now_s) - self.beat_at) > HEARTBEAT_STALE_S


def live_leases(leases: Mapping[Any, Any], now_s: float | None = None) -> dict[str, float]:
    """Worker hostname -> lease expiry (epoch seconds) of every lease in ``leases`` (the hash
    ``Keys.monitor()`` as HGETALL returns it) still live at ``now_s``; unreadable ones are
    skipped."""
    now_s = time.time() if now_s is None else now_s
    live: dict[str, float] = {}
    for host, raw in leases.items():
        try:
            expires_at = float(raw)
        except (TypeError, ValueError):
            continue
        if expires_at > now_s:
            live[host.decode() if isinstance(host, bytes) else str(host)] = expires_at
    return live


class MonitorWatch:
    """Whether a monitor watches a fleet now: some worker holds a live lease under ``key``
    (``Keys.monitor()``).

    One per app, shared by both of the dispatcher's publishing paths, the publishing thread's
    blocking read (:meth:`read`) and an event loop's own (:meth:`read_async`): they give the
    same answer, read from Redis at most once per ``WATCH_CACHE_S``. ``always``
    (``TOOLFLEET_TASK_EVENTS=always``): watched, without a read. A failed read raises the
    client's error and caches nothing; the caller decides (:meth:`remember`).
    """

    def __init__(
        self, key: str, *, always: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.key = key
        self.always = always
        self._clock = clock
        self._lock = threading.Lock()
        self._answer: tuple[float, bool] | None = None

    def cached(self) -> bool | None:
        """The answer while it stands, else None (the leases need a read)."""
        if self.always:
            return True
        answer = self._answer
        if answer is not None and self._clock() - answer[0] < WATCH_CACHE_S:
            return answer[1]
        return None

    def remember(self, watched: bool) -> bool:
        """Let ``watched`` stand for ``WATCH_CACHE_S``; returns it."""
        self._answer = (self._clock(), watched)
        return watched

    def read(self, client: Any) -> bool:
        """The answer, read with the blocking redis-py ``client`` when none stands (one
        thread reads at a time; the others take its answer)."""
        answer = self.cached()
        if answer is not None:
            return answer
        with self._lock:
            answer = self.cached()
            if answer is None:
                answer = self.remember(bool(live_leases(client.hgetall(self.key))))
            return answer

    async def read_async(self, client: Any) -> bool:
        """The answer, read with the asyncio redis-py ``client`` when none stands."""
        answer = self.cached()
        if answer is None:
            answer = self.remember(bool(live_leases(await client.hgetall(self.key))))
        return answer
