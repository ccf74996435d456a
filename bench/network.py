"""The ``network`` workload: one call at a time across a slow network, in round trips.

Every process of a mode (toolfleet: the dispatcher and its worker; raw Celery: the client, its
worker and the result backend, which share the broker URL) reaches Redis only through a
delaying proxy (bench/netproxy.py) that holds each chunk D ms each way, D = 0, 0.5, 1 and 5.
At each delay: the p50 of ``PING`` through the proxy (the path's round trip), then sequential
single calls of a sync ``echo`` and of an async ``echo_async`` — toolfleet
``await branch.act([one])``, raw Celery ``apply_async().get()`` and Celery with acks_late +
prefetch 1 — each p50/p99 in ms and in multiples of that ``PING``. Then, at a long delay, a
``MONITOR`` trace of a few calls counts the round trips on one call's critical path and names
the commands of each (bench/network_trace.py).

One private redis-server (the newest on PATH, as the ``roundtrips`` workload) serves the whole
workload, so the trace sees no other client; each (mode, tool) has its own proxy and worker,
kept across the delays (the proxy's delay changes in place). ``python -m bench --only network``
or ``python -m bench.network`` (options: ``--help``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from bench import fleet
from bench.celery_app import ECHO, ECHO_ASYNC
from bench.measure import Result, percentile, target_lines
from bench.netproxy import delay_proxy
from bench.network_trace import trace_calls
from bench.procs import WorkerProcess
from bench.raw_celery import RawCelery
from bench.raw_celery import worker as raw_worker
from bench.roundtrips import private_server
from bench.sizes import FULL, QUICK, Sizes

if TYPE_CHECKING:
    from bench.workloads import Context

__all__ = ["DELAYS_MS", "main", "measure", "run"]

DELAYS_MS = (0.0, 0.5, 1.0, 5.0)
# From this delay on, sizes.network_slow_calls calls: the run stays bounded.
SLOW_FROM_MS = 5.0
# The trace's delay: far above what a process computes per step, so steps fall apart cleanly.
TRACE_DELAY_MS = 20.0
TRACE_CALLS = 5
PINGS = 50
# Uncounted calls after each change of delay (and at the start): connections settle.
WARM_CALLS = 5
ASYNC_CONCURRENCY = 10
CALL_TIMEOUT_S = 120.0
# bench.workloads.RELIABLE's name (importing it would be a cycle: workloads imports this).
RELIABLE = "acks-late-prefetch-1"
# toolfleet's sync echo at 1 ms each way: (percentile, the most it may be as a ratio to Celery).
TARGET_DELAY_MS = 1.0
TARGETS = ((50, 0.8), (99, 1.0))

Calls = Callable[[Sequence[dict[str, Any]]], list[float]]


@dataclass(frozen=True, slots=True)
class Group:
    """One (mode, tool kind): a worker and a caller, behind their own proxy."""

    mode: str  # "toolfleet" or "celery"
    tool: str  # "sync" or "async"
    profile: str | None = None  # raw Celery's settings profile ("reliable")

    @property
    def key(self) -> str:
        return f"{self.mode}/{RELIABLE}" if self.profile else self.mode

    def variant(self, what: str) -> str:
        return ",".join(
            part for part in (self.tool, what, RELIABLE if self.profile else "") if part
        )


GROUPS = tuple(
    Group(mode, tool, profile)
    for tool in ("sync", "async")
    for mode, profile in (("toolfleet", None), ("celery", None), ("celery", "reliable"))
)


def run(ctx: Context) -> list[Result]:
    """Every line of the workload, for ``python -m bench`` (its broker is not used: see above)."""
    groups = [g for g in GROUPS if ctx.wants(g.mode)]
    skipped: list[Result] = []
    reason = fleet.unavailable()
    if reason and any(g.mode == "toolfleet" for g in groups):
        skipped.append(Result("network", "toolfleet", 0, 0.0, skipped=reason))
        groups = [g for g in groups if g.mode != "toolfleet"]
    trace_n = TRACE_CALLS if ctx.sizes is FULL else 3
    return skipped + measure(groups, ctx.sizes, DELAYS_MS, trace_n)


def measure(
    groups: Sequence[Group],
    sizes: Sizes,
    delays_ms: Sequence[float],
    trace_n: int,
    trace_delay_ms: float = TRACE_DELAY_MS,
) -> list[Result]:
    """Each group's line per delay and its trace line (``trace_n`` 0: none), with ratios."""
    results: list[Result] = []
    if not groups:
        return results
    with private_server() as (server, _):
        for group in groups:
            try:
                results += _group_lines(
                    server.port, group, sizes, delays_ms, trace_n, trace_delay_ms
                )
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:2000]
                results.append(
                    Result("network", group.mode, 0, 0.0, group.variant(""), error=error)
                )
    _compare(results)
    return results


@contextmanager
def _caller(group: Group, url: str, sync_workers: int) -> Iterator[tuple[Calls, WorkerProcess]]:
    """A started worker for ``group`` on ``url`` and a function timing sequential calls."""
    sync = group.tool == "sync"
    concurrency = sync_workers if sync else ASYNC_CONCURRENCY
    name = f"bench-network-{group.key.replace('/', '-')}-{group.tool}"
    if group.mode == "toolfleet":
        function = "echo" if sync else "echo_async"
        with fleet.worker(url, group.tool, concurrency, name) as worker:
            with fleet.FleetClient(url) as client:
                yield (lambda args: client.run_sequential(function, args, CALL_TIMEOUT_S)), worker
        return
    task, pool = (ECHO, "prefork") if sync else (ECHO_ASYNC, "threads")
    with raw_worker(url, pool, concurrency, name, group.profile) as worker:
        raw = RawCelery(url, group.profile)
        try:
            yield (lambda args: raw.run_sequential(task, args, CALL_TIMEOUT_S)), worker
        finally:
            raw.close()


def _group_lines(
    port: int,
    group: Group,
    sizes: Sizes,
    delays_ms: Sequence[float],
    trace_n: int,
    trace_delay_ms: float,
) -> list[Result]:
    args = [{"value": i} for i in range(max(sizes.network_calls, sizes.network_slow_calls))]
    lines = []
    with delay_proxy(port) as proxy, _caller(group, proxy.url(), sizes.echo_workers) as (calls, w):
        calls(args[:WARM_CALLS])
        for delay_ms in delays_ms:
            n = sizes.network_slow_calls if delay_ms >= SLOW_FROM_MS else sizes.network_calls
            proxy.set_delay(delay_ms)
            calls(args[:WARM_CALLS])
            load = os.getloadavg()[0]
            ping_ms = _ping_p50_ms(proxy.url(), PINGS)
            latencies = calls(args[:n])
            p50, p99 = (1000 * percentile(latencies, pct) for pct in (50, 99))
            extra = {
                "delay_ms": delay_ms,
                "ping_p50_ms": ping_ms,
                "p50_ms": p50,
                "p99_ms": p99,
                "p50_round_trips": p50 / ping_ms,
                "p99_round_trips": p99 / ping_ms,
                "load_1m": load,
            }
            variant = group.variant(f"delay={delay_ms:g}ms")
            lines.append(Result("network", group.mode, n, sum(latencies), variant, extra))
        if trace_n:
            started = time.perf_counter()
            caller = "dispatcher" if group.mode == "toolfleet" else "client"
            trace = trace_calls(
                port, proxy, lambda a: calls([a]), trace_n, trace_delay_ms, w.pid, caller
            )
            wall_s = time.perf_counter() - started
            variant = group.variant(f"trace,delay={trace_delay_ms:g}ms")
            lines.append(Result("network", group.mode, trace_n, wall_s, variant, trace))
    return lines


def _ping_p50_ms(url: str, pings: int) -> float:
    """The p50 of ``PING`` on a fresh connection through the proxy: the path's round trip."""
    client = redis.Redis.from_url(url)
    try:
        client.ping()
        times = []
        for _ in range(pings):
            start = time.perf_counter()
            client.ping()
            times.append(time.perf_counter() - start)
    finally:
        client.close()
    return 1000 * percentile(times, 50)


def _compare(results: Sequence[Result]) -> None:
    """Ratios of each line to the raw-Celery lines of the same tool and delay (or trace)."""
    by_place: dict[tuple[str, str], dict[str, Result]] = {}
    for r in results:
        if r.ok:
            tool, place = r.variant.split(",")[:2]
            key = f"{r.mode}/{RELIABLE}" if RELIABLE in r.variant else r.mode
            by_place.setdefault((tool, place), {})[key] = r
    for (tool, place), row in by_place.items():
        for key, r in row.items():
            for other_key, other in row.items():
                if other_key == key or not other_key.startswith("celery"):
                    continue
                if place.startswith("trace"):
                    mine, theirs = (x.extra["round_trips_on_path"] for x in (r, other))
                    r.ratios[f"round_trips_vs_{other_key}"] = mine / theirs
                    continue
                for pct in (50, 99):
                    ratio = r.extra[f"p{pct}_ms"] / other.extra[f"p{pct}_ms"]
                    r.ratios[f"p{pct}_vs_{other_key}"] = ratio
        ours, celery = row.get("toolfleet"), row.get("celery")
        if tool == "sync" and place == f"delay={TARGET_DELAY_MS:g}ms" and ours and celery:
            for pct, limit in TARGETS:
                ratio = ours.ratios[f"p{pct}_vs_celery"]
                name = f"network p{pct} at {TARGET_DELAY_MS:g} ms <= {limit:g} x celery"
                ours.targets.append({"name": name, "value": round(ratio, 3), "met": ratio <= limit})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.network",
        description="Sequential single calls through a delaying proxy: toolfleet vs raw Celery.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--calls", type=int, help="calls per delay (default 200; quick 20)")
    parser.add_argument("--slow-calls", type=int, help=f"calls at {SLOW_FROM_MS:g} ms and more")
    parser.add_argument(
        "--delays",
        default=",".join(f"{d:g}" for d in DELAYS_MS),
        help="ms each way, comma-separated",
    )
    parser.add_argument("--mode", action="append", choices=("toolfleet", "celery"))
    parser.add_argument("--tool", action="append", choices=("sync", "async"))
    parser.add_argument(
        "--trace-calls",
        type=int,
        default=None,
        help=f"calls traced (default {TRACE_CALLS}; 0: none)",
    )
    parser.add_argument("--trace-delay-ms", type=float, default=TRACE_DELAY_MS)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.calls:
        sizes = dataclasses.replace(sizes, network_calls=args.calls)
    if args.slow_calls:
        sizes = dataclasses.replace(sizes, network_slow_calls=args.slow_calls)
    try:
        delays = [float(d) for d in args.delays.split(",")]
    except ValueError:
        delays = [-1.0]
    if any(d < 0 for d in delays):
        parser.error(f"--delays {args.delays!r}: give milliseconds each way, >= 0, e.g. 0,0.5,1,5")
    groups = [
        g
        for g in GROUPS
        if g.mode in (args.mode or (g.mode,)) and g.tool in (args.tool or (g.tool,))
    ]
    trace_n = args.trace_calls if args.trace_calls is not None else 3 if args.quick else TRACE_CALLS
    results = measure(groups, sizes, delays, trace_n, args.trace_delay_ms)
    for result in results:
        print(result.to_json(), flush=True)
        for line in target_lines(result):
            print(line, flush=True)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
