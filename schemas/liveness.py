"""How a worker and a call show they are alive, as both sides read it in Redis.

A call a worker runs has a started marker (``Keys.started(call_id)``) whose heartbeat the
worker refreshes; a marker older than ``HEARTBEAT_STALE_S`` belongs to a worker that died or
froze mid-call (C7). A worker beats its queues into ``Keys.workers(queue)``; a beat older than
``PRESENCE_STALE_S`` no longer counts as a live consumer.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

__all__ = ["HEARTBEAT_STALE_S", "PRESENCE_STALE_S", "StartedMarker", "live_since"]

# A started marker not refreshed for this long belongs to a worker that died (or froze).
HEARTBEAT_STALE_S = 8.0
# Several missed presence beats: a loaded machine delays a beat, a dead worker misses all.
PRESENCE_STALE_S = 10.0


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
