"""Raw-Celery mode: a ``group`` of the plain task, results through the Redis result backend."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from celery import Celery, group

from bench.celery_app import QUEUE, make_app
from bench.procs import WorkerProcess

__all__ = ["RawCelery", "worker"]


def worker(
    broker_url: str, pool: str, concurrency: int, name: str, profile: str | None = None
) -> WorkerProcess:
    """A plain ``celery worker`` process for the bench app, not yet started.

    ``profile="toolfleet"``: with toolfleet's acks_late, prefetch 1 and task events.
    """
    env = {"BENCH_BROKER_URL": broker_url, "BENCH_CELERY_PROFILE": profile or ""}
    argv = [
        sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
        "-P", pool, "-c", str(concurrency), "-Q", QUEUE, "-n", f"{name}@%h",
        "-l", "info", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    if profile == "toolfleet":
        argv.append("--task-events")
    return WorkerProcess(argv, env=env, name=name)


class RawCelery:
    """The dispatcher side of the baseline."""

    def __init__(self, broker_url: str, profile: str | None = None) -> None:
        self.app: Celery = make_app(broker_url, profile)

    def run_batch(self, task: str, arguments: Sequence[dict[str, Any]], timeout_s: float) -> float:
        """Wall seconds from the first publish to the last result collected."""
        sig = self.app.signature(task)
        start = time.perf_counter()
        result = group(sig.clone(kwargs=a) for a in arguments).apply_async()
        values = result.get(timeout=timeout_s)
        wall_s = time.perf_counter() - start
        result.forget()
        if len(values) != len(arguments):
            raise RuntimeError(f"raw Celery returned {len(values)} results for {len(arguments)}")
        return wall_s

    def run_sequential(
        self, task: str, arguments: Sequence[dict[str, Any]], timeout_s: float
    ) -> list[float]:
        """Per-call latency of ``apply_async().get()``, one call after the other."""
        sig = self.app.signature(task)
        latencies = []
        for a in arguments:
            start = time.perf_counter()
            async_result = sig.clone(kwargs=a).apply_async()
            async_result.get(timeout=timeout_s)
            latencies.append(time.perf_counter() - start)
            async_result.forget()
        return latencies

    def close(self) -> None:
        self.app.close()
