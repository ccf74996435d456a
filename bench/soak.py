"""``python -m bench.soak``: push 100,000 calls through a fleet; report lost, duplicated, memory.

Starts a sync and an async ``toolfleet worker`` on a private Redis database, sends the calls
in rounds of ``Branch.act`` (half sync, half async tools, each call with its own token), and
checks every token: lost = a call without a COMPLETED result or whose tool never ran;
duplicated = a tool that ran more than once for one call. Dispatcher and worker memory are
sampled before the first round and after the last. Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import redis

from bench.__main__ import claim_db
from bench.procs import WorkerProcess, toolfleet_worker
from bench.rss_probe import vm_kb
from bench.soak_tools import RUNS_KEY

__all__ = ["main"]

TOOL_MODULE = "bench.soak_tools"


def _worker(broker_url: str, kind: str, concurrency: int) -> WorkerProcess:
    env = {"TOOLFLEET_BROKER_URL": broker_url}
    return toolfleet_worker(kind, concurrency, TOOL_MODULE, f"soak-{kind}", env)


def _mb(kb: int) -> float:
    return round(kb / 1024, 1)


async def _soak(
    broker_url: str, calls: int, round_size: int, batched: bool, workers: list[WorkerProcess]
) -> dict[str, Any]:
    from bench.fleet import BATCH_SIZE
    from toolfleet.dispatcher.branch import Branch
    from toolfleet.dispatcher.fleet import Fleet
    from toolfleet.schemas.action import CallParams
    from toolfleet.schemas.settings import Settings
    from toolfleet.schemas.status import EventStatus

    settings = Settings(broker_url=broker_url, tools=(TOOL_MODULE,))
    fleet = Fleet(settings)
    # --batched: several calls per toolfleet.execute_many message, as the bench's batched mode.
    params = CallParams(bundle_size=BATCH_SIZE) if batched else CallParams()
    completed: set[int] = set()
    seen_call_ids: set[str] = set()
    repeated_results = 0
    try:
        # Warm up outside the counted tokens (negative), so "start" memory is a running fleet.
        warm = [{"function": "soak_sync", "arguments": {"token": -1}}]
        warm.append({"function": "soak_async", "arguments": {"token": -2}})
        await Branch(fleet=fleet).act(warm)
        start = {
            "dispatcher_rss_mb": _mb(vm_kb("VmRSS")),
            "workers_rss_mb": {w.name: _mb(w.rss_kb()) for w in workers},
        }
        began = time.perf_counter()
        for first in range(0, calls, round_size):
            tokens = range(first, min(first + round_size, calls))
            requests = [
                {"function": "soak_sync" if t % 2 == 0 else "soak_async", "arguments": {"token": t}}
                for t in tokens
            ]
            results = await Branch(fleet=fleet).act(requests, call_params=params)
            for r in results:
                if r.call_id in seen_call_ids:
                    repeated_results += 1
                if r.call_id is not None:
                    seen_call_ids.add(r.call_id)
                if r.status is EventStatus.COMPLETED and isinstance(r.output, int):
                    completed.add(r.output)
            elapsed_s = time.perf_counter() - began
            print(
                f"soak: {tokens.stop}/{calls} calls, {len(completed)} completed, "
                f"{tokens.stop / elapsed_s:.0f} calls/s, dispatcher "
                f"{_mb(vm_kb('VmRSS'))} MB",
                file=sys.stderr,
                flush=True,
            )
        wall_s = time.perf_counter() - began
        end = {
            "dispatcher_rss_mb": _mb(vm_kb("VmRSS")),
            # What the soak itself holds in the dispatcher's process to count lost and
            # duplicated calls; the dispatcher's own growth is the RSS growth minus this.
            "soak_bookkeeping_mb": _mb(_deep_size(seen_call_ids, completed) // 1024),
            "workers_rss_mb": {w.name: _mb(w.rss_kb()) for w in workers},
        }
    finally:
        # Bounded, so a dispatcher that cannot shut down still lets the report print.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fleet.aclose(), 15)
    return {
        "completed": completed,
        "repeated_results": repeated_results,
        "wall_s": wall_s,
        "start": start,
        "end": end,
    }


def _deep_size(*collections: set[Any]) -> int:
    """Bytes of ``collections`` and the objects in them (none is shared with the fleet)."""
    return sum(sys.getsizeof(c) + sum(sys.getsizeof(item) for item in c) for c in collections)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--round-size", type=int, default=10_000, help="calls per Branch.act")
    parser.add_argument(
        "--batched", action="store_true", help="publish through toolfleet.execute_many"
    )
    parser.add_argument("--sync-concurrency", type=int, default=2)
    parser.add_argument("--async-concurrency", type=int, default=500)
    parser.add_argument("--redis-host", default="127.0.0.1")
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--db", type=int, default=None, help="empty Redis database to use")
    args = parser.parse_args(argv)
    client = claim_db(args.redis_host, args.redis_port, args.db)
    if client is None:
        print("soak: no empty Redis database; pass a free one with --db N", file=sys.stderr)
        return 2
    db = client.connection_pool.connection_kwargs["db"]
    broker_url = f"redis://{args.redis_host}:{args.redis_port}/{db}"
    workers = [
        _worker(broker_url, "sync", args.sync_concurrency),
        _worker(broker_url, "async", args.async_concurrency),
    ]
    try:
        for w in workers:
            w.start()
        outcome = asyncio.run(_soak(broker_url, args.calls, args.round_size, args.batched, workers))
        runs = _runs(client)
    finally:
        for w in workers:
            w.stop()
        client.flushdb()
        client.close()
    tokens = range(args.calls)
    lost = sum(1 for t in tokens if t not in outcome["completed"] or runs.get(t, 0) == 0)
    duplicated = sum(1 for t in tokens if runs.get(t, 0) > 1) + outcome["repeated_results"]
    report = {
        "calls": args.calls,
        "publish": "batched" if args.batched else "per-call",
        "completed": len(outcome["completed"]),
        "lost": lost,
        "duplicated": duplicated,
        "wall_s": round(outcome["wall_s"], 1),
        "calls_per_s": round(args.calls / outcome["wall_s"], 1),
        "start": outcome["start"],
        "end": outcome["end"],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(report))
    return 0 if lost == 0 and duplicated == 0 else 1


def _runs(client: redis.Redis) -> dict[int, int]:
    raw: dict[bytes, bytes] = client.hgetall(RUNS_KEY)  # type: ignore[assignment]
    return {int(k): int(v) for k, v in raw.items()}


if __name__ == "__main__":
    sys.exit(main())
