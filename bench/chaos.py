"""``python -m bench.chaos``: longer chaos runs than the suite's ``-m chaos`` tests.

The same faults with more calls and more kills: async and sync worker SIGKILL storms and
repeated broker crash+restarts, each on a redis-server of its own with real workers. One JSON
line per run, counted exactly as the chaos tests count
(``tests.support.chaos_support.judge``): lost, finished-and-re-run, non-idempotent calls run
twice, calls without one linked pair in Redis, plus how long ``act()`` took. Not part of the
test run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.chaos_support import (
    Ledger,
    act_and_load,
    chaos_calls,
    chaos_settings,
    judge,
    replace_a_worker,
    start_chaos_worker,
)
from tests.support.fleet import WorkerProcess
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until_async

__all__ = ["main"]

# One reserved call per async slot: a deeper prefetch outlives the short visibility timeout
# under load and every such call is delivered twice (harmless, C7, but slow).
ENV = {
    "TOOLFLEET_VISIBILITY_TIMEOUT_S": "5",
    "TOOLFLEET_ASYNC_PREFETCH": "1",
    "TOOLFLEET_OUTAGE_LIMIT_S": "60",
}


def _start(kind: str, broker: PrivateRedis, concurrency: int) -> WorkerProcess:
    return start_chaos_worker(kind, broker, concurrency, ENV)


def _line(name: str, faults: int, elapsed_s: float, verdict: Any) -> dict[str, Any]:
    line = {"chaos": name, "faults": faults, "elapsed_s": round(elapsed_s, 1), **verdict.summary()}
    problems = verdict.lost + verdict.unpaired
    if problems:  # what went wrong, so a failed run can be investigated
        line["problems"] = problems[:5]
    return line


def _run(
    name: str,
    broker: PrivateRedis,
    pool: list[WorkerProcess],
    requests: list[dict[str, Any]],
    ledger: Ledger,
    fault: Callable[[int], Any],
    faults: int,
    killed: set[int] | None = None,
) -> dict[str, Any]:
    """Act on ``requests`` and call ``fault(k)`` each time another 1/(faults+1) finished."""
    settings = chaos_settings(broker, reconcile_grace_s=2.0)

    async def chaos(branch: Any, task: asyncio.Future[Any]) -> None:
        for k in range(1, faults + 1):
            share = k * len(requests) // (faults + 1)

            def reached(share: int = share) -> bool:
                return ledger.count("E") >= share

            await until_async(
                reached, timeout_s=600, what=f"{k}/{faults + 1} of the calls", while_running=task
            )
            await fault(k)

    try:
        results, stored, elapsed_s = act_and_load(settings, requests, chaos, limit_s=1800)
    finally:
        for worker in pool:
            worker.stop(timeout_s=5)
        broker.kill()
    verdict = judge(requests, results, stored, ledger, killed_pids=killed or set())
    return _line(name, faults, elapsed_s, verdict)


def worker_storm(kind: str, calls: int, kills: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    broker = PrivateRedis(persist=False)
    broker.start()
    concurrency = 50 if kind == "async" else 4
    pool = [_start(kind, broker, concurrency) for _ in range(2)]
    ledger = Ledger(Path(tempfile.mkdtemp(prefix="toolfleet-chaos-")))
    functions = (f"chaos_{kind}", f"chaos_{kind}_once")
    requests = chaos_calls(ledger, functions, calls, lambda _: rng.uniform(0.2, 1.0))
    killed: set[int] = set()

    async def kill(_k: int) -> None:
        killed.update(await replace_a_worker(pool, rng, lambda: _start(kind, broker, concurrency)))

    return _run(f"{kind}-sigkill-storm", broker, pool, requests, ledger, kill, kills, killed)


def broker_restarts(calls: int, restarts: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    broker = PrivateRedis(persist=True)
    broker.start()
    pool = [_start("sync", broker, 4), _start("async", broker, 50)]
    ledger = Ledger(Path(tempfile.mkdtemp(prefix="toolfleet-chaos-")))
    functions = ("chaos_sync", "chaos_async", "chaos_sync_once", "chaos_async_once")
    requests = chaos_calls(ledger, functions, calls, lambda _: rng.uniform(0.1, 0.5))

    async def restart(_k: int) -> None:
        await asyncio.to_thread(broker.kill)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(broker.start)

    return _run("broker-restarts", broker, pool, requests, ledger, restart, restarts)


RUNS = ("async-storm", "sync-storm", "broker-restarts")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--only", action="append", choices=RUNS, help="repeatable")
    parser.add_argument("--async-calls", type=int, default=2000)
    parser.add_argument("--sync-calls", type=int, default=300)
    parser.add_argument("--restart-calls", type=int, default=600)
    parser.add_argument("--kills", type=int, default=10, help="kills per storm")
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args(argv)
    started = time.monotonic()
    clean = True
    for name in args.only or RUNS:
        if name == "async-storm":
            line = worker_storm("async", args.async_calls, args.kills, args.seed)
        elif name == "sync-storm":
            line = worker_storm("sync", args.sync_calls, args.kills, args.seed)
        else:
            line = broker_restarts(args.restart_calls, args.restarts, args.seed)
        clean = clean and not any(line[k] for k in ("lost", "finished_rerun", "unpaired"))
        clean = clean and not line["rerun_not_idempotent"]
        print(json.dumps(line), flush=True)
    print(
        json.dumps(
            {"chaos": "total", "clean": clean, "wall_s": round(time.monotonic() - started, 1)}
        )
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
