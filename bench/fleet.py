"""toolfleet mode: ``Branch.act`` on a Fleet, with ``toolfleet worker`` processes."""

from __future__ import annotations

from bench.procs import WorkerProcess

__all__ = ["FleetClient", "unavailable", "worker"]


def unavailable(batched: bool = False) -> str | None:
    return "toolfleet dispatcher not built yet"


def worker(broker_url: str, kind: str, concurrency: int, name: str) -> WorkerProcess:
    raise NotImplementedError


class FleetClient:
    pass
