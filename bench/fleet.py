"""toolfleet mode: ``Branch.act`` on a Fleet, with ``toolfleet worker`` processes.

The batched mode is the same ``Branch.act`` with ``CallParams(bundle_size=BATCH_SIZE)``: the
fleet publishes several calls per ``toolfleet.execute_many`` message instead of one per call.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.procs import WorkerProcess, toolfleet_worker

__all__ = ["BATCH_SIZE", "FleetClient", "unavailable", "worker"]

TOOL_MODULE = "bench.fleet_tools"
BATCH_SIZE = 100
CLOSE_TIMEOUT_S = 15.0


def unavailable(batched: bool = False) -> str | None:
    """Why toolfleet cannot be benchmarked in this checkout, or None."""
    try:
        import toolfleet.dispatcher.branch
        import toolfleet.workers.app
    except ImportError as exc:
        return f"toolfleet is not importable here: {exc}"
    if batched:
        try:
            import toolfleet.workers.bundle  # noqa: F401
        except ImportError as exc:
            return f"batching is not available: {exc}"
    return None


def worker(
    broker_url: str, kind: str, concurrency: int, name: str, *, events: bool = False
) -> WorkerProcess:
    """A ``toolfleet worker`` process serving the bench tools, not yet started.

    ``events``: task events always on (``TOOLFLEET_TASK_EVENTS=always``), what a watching
    monitor's lease turns on; off, the product default with no monitor attached.
    """
    env = {"TOOLFLEET_BROKER_URL": broker_url}
    env["TOOLFLEET_TASK_EVENTS"] = "always" if events else "monitor"
    return toolfleet_worker(kind, concurrency, TOOL_MODULE, name, env)


class FleetClient:
    """A dispatcher on its own event loop: ``Branch.act`` batches timed from the caller's side."""

    def __init__(
        self, broker_url: str, *, batched: bool = False, events: bool = False, auto: bool = False
    ) -> None:
        from toolfleet.dispatcher.fleet import Fleet
        from toolfleet.schemas.settings import Settings

        settings = Settings(
            broker_url=broker_url,
            tools=(TOOL_MODULE,),
            task_events="always" if events else "monitor",
        )
        self.batched = batched
        # CallParams(bundle_size="auto") with the default window: the dispatcher decides.
        self.auto = auto
        self.fleet = Fleet(settings)
        self.loop = asyncio.new_event_loop()

    def run_batch(
        self,
        function: str,
        arguments: Sequence[dict[str, Any]],
        timeout_s: float,
        max_in_flight: int | None = None,
    ) -> float:
        """Wall seconds for one ``act()`` of every call, from the call to the last result.

        Batched mode needs a window of at least a few batches to fill its messages, so it
        defaults ``max_in_flight`` to the whole batch; per-call mode keeps the default window.
        """
        if self.batched and max_in_flight is None:
            max_in_flight = len(arguments)
        return self.loop.run_until_complete(
            self._timed(function, arguments, timeout_s, max_in_flight)
        )

    def run_sequential(
        self, function: str, arguments: Sequence[dict[str, Any]], timeout_s: float
    ) -> list[float]:
        """Per-call latency of ``await branch.act(one_request)``, one after the other."""

        async def main() -> list[float]:
            return [await self._timed(function, [a], timeout_s, None) for a in arguments]

        return self.loop.run_until_complete(main())

    async def _timed(
        self,
        function: str,
        arguments: Sequence[dict[str, Any]],
        timeout_s: float,
        max_in_flight: int | None,
    ) -> float:
        from toolfleet.dispatcher.branch import Branch
        from toolfleet.schemas.action import CallParams
        from toolfleet.schemas.status import EventStatus

        branch = Branch(fleet=self.fleet)
        requests = [{"function": function, "arguments": a} for a in arguments]
        size = "auto" if self.auto else BATCH_SIZE if self.batched else None
        params = CallParams(max_in_flight=max_in_flight, bundle_size=size)
        start = time.perf_counter()
        act = asyncio.ensure_future(branch.act(requests, call_params=params))
        done, _ = await asyncio.wait({act}, timeout=timeout_s)
        if not done:
            # Diagnose before cancelling: a cancelled act() forgets the calls it awaited.
            diagnosis = await self._diagnose()
            act.cancel()
            await asyncio.gather(act, return_exceptions=True)
            raise RuntimeError(
                f"toolfleet {function}: act() of {len(requests)} calls did not return within "
                f"{timeout_s:g}s; {diagnosis}"
            )
        results = act.result()
        wall_s = time.perf_counter() - start
        bad = [r for r in results if r.status is not EventStatus.COMPLETED]
        if len(results) != len(requests) or bad:
            first = bad[0].error if bad else "missing results"
            raise RuntimeError(
                f"toolfleet {function}: {len(results) - len(bad)} of {len(requests)} calls "
                f"completed; first problem: {first}"
            )
        return wall_s

    async def _diagnose(self) -> str:
        """Which awaited calls finished on a worker but whose reply never reached us."""
        pending = list(getattr(self.fleet.collector, "_pending", {}))
        if not pending:
            return "no call is awaited by the collector"
        raws = await self.fleet.redis.mget([self.fleet.keys.event(c) for c, _ in pending])
        stored = sum(raw is not None for raw in raws)
        return (
            f"{len(pending)} calls still awaited, {stored} of them with a terminal record in "
            f"Redis (finished, but their reply was lost between the reply list and the collector)"
        )

    def close(self) -> None:
        self.loop.run_until_complete(self._aclose())
        self.loop.close()

    async def _aclose(self) -> None:
        # Bounded: a dispatcher that cannot shut down must not stall the whole benchmark.
        try:
            await asyncio.wait_for(self.fleet.aclose(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            print(
                f"bench: Fleet.aclose() did not finish within {CLOSE_TIMEOUT_S:g}s; "
                f"tasks still running:",
                file=sys.stderr,
            )
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.print_stack(limit=6, file=sys.stderr)
                    task.cancel()

    def __enter__(self) -> FleetClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
