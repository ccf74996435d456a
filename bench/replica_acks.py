"""What ``TOOLFLEET_REPLICA_ACKS=1`` costs per call: a primary and a replica of its own (both
``appendonly yes``, ``appendfsync always``, as deploy/README.md recommends), one sync and one
async ``toolfleet worker``, the same calls with 0 and with 1 replica acknowledgement.

``python -m bench.replica_acks`` prints one JSON line per result:

- ``latency``: sequential single-call act()s of ``echo`` (sync, prefork) and ``sleep_async``
  (0 s, asyncio pool), p50/p99 ms of each act() after warm-up calls;
- ``throughput``: one act() of ``--calls`` async calls (a mixed window of 256): wall time,
  calls/s, amortized ms per call.

With acks on, each call adds one ``PING`` + ``WAIT 1 1000`` after the worker's record and one
after each history chunk the dispatcher writes (docs/call-cost.md#waiting-for-a-replica). The
brokers are reached by their ``redis://`` URL, so the figures are WAIT's alone (a Sentinel URL
adds nothing per call once a connection is open).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from bench.fleet_tools import TOOL_MODULE
from bench.measure import percentile
from bench.procs import WorkerProcess, toolfleet_worker
from tests.support.sentinel_cluster import SentinelCluster

__all__ = ["main"]

BATCH_TIMEOUT_S = 300.0


def _worker(url: str, kind: str, concurrency: int, acks: int) -> WorkerProcess:
    env = {"TOOLFLEET_BROKER_URL": url, "TOOLFLEET_REPLICA_ACKS": str(acks)}
    return toolfleet_worker(kind, concurrency, TOOL_MODULE, f"bench-acks{acks}-{kind}", env)


async def _measure(url: str, acks: int, sequential: int, calls: int) -> list[dict[str, Any]]:
    from toolfleet.dispatcher import Branch, Fleet
    from toolfleet.schemas.settings import Settings
    from toolfleet.schemas.status import EventStatus

    settings = Settings(broker_url=url, tools=(TOOL_MODULE,), replica_acks=acks)
    lines: list[dict[str, Any]] = []
    async with Fleet(settings) as fleet:
        branch = Branch(fleet=fleet)
        for function, arguments in (("echo", {"value": 1}), ("sleep_async", {"seconds": 0})):
            request = {"function": function, "arguments": arguments}
            for _ in range(10):  # warm-up: connections open, scripts loaded
                await branch.act([request])
            times: list[float] = []
            for _ in range(sequential):
                started = time.perf_counter()
                [result] = await asyncio.wait_for(branch.act([request]), BATCH_TIMEOUT_S)
                times.append(time.perf_counter() - started)
                assert result.status is EventStatus.COMPLETED, result.error
            lines.append(
                {
                    "workload": "latency",
                    "tool": function,
                    "replica_acks": acks,
                    "calls": sequential,
                    "p50_ms": round(1000 * percentile(times, 50), 2),
                    "p99_ms": round(1000 * percentile(times, 99), 2),
                }
            )
        batch = Branch(fleet=fleet)
        requests = [{"function": "sleep_async", "arguments": {"seconds": 0}}] * calls
        started = time.perf_counter()
        results = await asyncio.wait_for(batch.act(requests), BATCH_TIMEOUT_S)
        wall_s = time.perf_counter() - started
        assert all(r.status is EventStatus.COMPLETED for r in results)
        lines.append(
            {
                "workload": "throughput",
                "tool": "sleep_async",
                "replica_acks": acks,
                "calls": calls,
                "wall_s": round(wall_s, 2),
                "calls_per_s": round(calls / wall_s, 1),
                "per_call_ms": round(1000 * wall_s / calls, 3),
            }
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replica_acks")
    parser.add_argument("--sequential", type=int, default=200, help="single-call act()s")
    parser.add_argument("--calls", type=int, default=2000, help="calls of the throughput act()")
    args = parser.parse_args(argv)
    cluster = SentinelCluster(sentinels=0, replicas=1)
    try:
        cluster.start()
        url = f"redis://127.0.0.1:{cluster.data[0].port}/0"
        for acks in (0, 1):
            with _worker(url, "sync", 2, acks), _worker(url, "async", 256, acks):
                for line in asyncio.run(_measure(url, acks, args.sequential, args.calls)):
                    print(json.dumps(line), flush=True)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
