"""The ``progress`` workload: how long a tool's progress report takes to reach the dispatcher's
callback, and what progress costs in Redis commands (docs/controls.md).

Latency lines (``variant`` ``sync`` / ``async``): calls run at once, each reporting ``reports``
times ``GAP_S`` apart (more than the 0.1 s throttle, so no report waits for it). A report's
latency is the time the ``Branch.on_progress`` callback saw it minus the time the tool called
``current_call().progress()`` (``CallProgress.reported_at``; one machine, one clock): the
worker's sender thread, the RPUSH, the collector's BLMPOP and the relay task. p50 / p99 / max
over every report of the batch, after one warm-up call.

Commands lines (``variant`` ``commands-*``): on a redis-server of their own (as the
``roundtrips`` workload), sequential calls of a sync tool that calls ``progress()`` 5 times
with no gap, against the same loop that reports nothing: ``commands-quiet`` (reports nothing),
``commands-unasked`` (reports, nobody listens: must equal quiet), ``commands-listening``
(a callback: the reports that go out cost their pushes; here one per call, as the 5
reports come faster than the sender thread wakes, and it sends the newest).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from bench import fleet
from bench.measure import Result, percentile
from bench.procs import WorkerProcess, toolfleet_worker
from bench.progress_tools import TOOL_MODULE
from bench.roundtrips import WARMUP_CALLS, measure_commands, private_server
from bench.sizes import FULL

__all__ = ["run"]

GAP_S = 0.15
BATCH_TIMEOUT_S = 120.0


def run(ctx: Any) -> list[Result]:
    """Every line of the workload (``ctx``: bench.workloads.Context)."""
    if not ctx.wants("toolfleet"):
        return []
    reason = fleet.unavailable()
    if reason:
        return [Result("progress", "toolfleet", 0, 0.0, skipped=reason)]
    full = ctx.sizes is FULL
    results: list[Result] = []
    # (kind, tool, calls at once, reports per call)
    for kind, function, calls, reports in (
        ("sync", "report_sync", 8 if full else 4, 20 if full else 5),
        ("async", "report_async", 50 if full else 10, 20 if full else 5),
    ):
        try:
            results.append(_latency_line(ctx.broker_url, kind, function, calls, reports))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            results.append(Result("progress", "toolfleet", calls, 0.0, kind, error=error))
    try:
        results.extend(_command_lines(50 if full else 20))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        results.append(Result("progress", "toolfleet", 0, 0.0, "commands", error=error))
    return results


def _worker(broker_url: str, kind: str, concurrency: int, name: str) -> WorkerProcess:
    return toolfleet_worker(
        kind, concurrency, TOOL_MODULE, name, {"TOOLFLEET_BROKER_URL": broker_url}
    )


def _latency_line(broker_url: str, kind: str, function: str, calls: int, reports: int) -> Result:
    with _worker(broker_url, kind, calls, f"bench-progress-{kind}"):
        latencies, wall_s = asyncio.run(_timed(broker_url, function, calls, reports))
    extra = {
        "reports": len(latencies),
        "reports_per_call": reports,
        "gap_s": GAP_S,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
        "max_ms": 1000 * max(latencies),
    }
    return Result("progress", "toolfleet", calls, wall_s, kind, extra)


async def _timed(
    broker_url: str, function: str, calls: int, reports: int
) -> tuple[list[float], float]:
    from toolfleet.dispatcher import Branch, CallProgress, Fleet
    from toolfleet.schemas.settings import Settings
    from toolfleet.schemas.status import EventStatus

    latencies: list[float] = []

    def seen(progress: CallProgress) -> None:
        latencies.append(time.time() - progress.reported_at)

    async with Fleet(Settings(broker_url=broker_url, tools=(TOOL_MODULE,))) as fleet_:
        branch = Branch(fleet=fleet_)
        branch.on_progress(seen)
        warm = {"function": function, "arguments": {"reports": 2, "gap_s": GAP_S}}
        await asyncio.wait_for(branch.act([warm] * calls), BATCH_TIMEOUT_S)
        latencies.clear()
        requests = [{"function": function, "arguments": {"reports": reports, "gap_s": GAP_S}}]
        started = time.perf_counter()
        results = await asyncio.wait_for(branch.act(requests * calls), BATCH_TIMEOUT_S)
        wall_s = time.perf_counter() - started
    bad = [r for r in results if r.status is not EventStatus.COMPLETED]
    if bad or len(latencies) != calls * reports:
        raise RuntimeError(
            f"{function}: {len(bad)} of {calls} calls did not complete, "
            f"{len(latencies)} of {calls * reports} reports arrived"
        )
    return latencies, wall_s


def _command_lines(calls: int) -> list[Result]:
    from toolfleet.dispatcher import Branch, Fleet
    from toolfleet.schemas.settings import Settings

    arguments = {"reports": 5, "gap_s": 0.0}
    results = []
    with private_server() as (server, client):
        with _worker(server.url, "sync", 2, "bench-progress-commands"):
            loop = asyncio.new_event_loop()
            fleet_ = Fleet(Settings(broker_url=server.url, tools=(TOOL_MODULE,)))
            try:
                for variant, function, listening in (
                    ("commands-quiet", "quiet_sync", False),
                    ("commands-unasked", "report_sync", False),
                    ("commands-listening", "report_sync", True),
                ):
                    branch = Branch(fleet=fleet_)
                    if listening:
                        branch.on_progress(lambda progress: None)
                    one = [{"function": function, "arguments": arguments}]

                    def sequential(
                        n: int, branch: Branch = branch, one: list[dict[str, Any]] = one
                    ) -> Callable[[], None]:
                        async def calls_in_turn() -> None:
                            for _ in range(n):
                                await branch.act(one)

                        return lambda: loop.run_until_complete(calls_in_turn())

                    sequential(WARMUP_CALLS)()
                    per_call, wall_s = measure_commands(client, sequential(calls), calls)
                    extra = {
                        "commands_per_call": round(sum(per_call.values()), 2),
                        "commands": {k: round(v, 2) for k, v in per_call.items()},
                    }
                    results.append(Result("progress", "toolfleet", calls, wall_s, variant, extra))
            finally:
                loop.run_until_complete(fleet_.aclose())
                loop.close()
    quiet, unasked, listening_line = results
    ratio = unasked.extra["commands_per_call"] / quiet.extra["commands_per_call"]
    unasked.ratios["commands_vs_quiet"] = ratio
    listening_line.ratios["commands_vs_quiet"] = (
        listening_line.extra["commands_per_call"] / quiet.extra["commands_per_call"]
    )
    unasked.targets.append(
        {"name": "progress nobody asked for adds no command", "value": round(ratio, 3),
         "met": unasked.extra["commands_per_call"] <= quiet.extra["commands_per_call"]}
    )  # fmt: skip
    return results
