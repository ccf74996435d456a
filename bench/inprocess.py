"""In-process mode: ``FunctionCalling.invoke()`` on one asyncio loop, as agent frameworks do today.

Sync tools run inline on the loop (ADR-0012 D6), so blocking calls serialize.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from toolfleet.schemas import EventStatus, FunctionCalling, Tool

__all__ = ["run_batch", "run_sequential"]


def _tool(func: Callable[..., Any]) -> Tool:
    return Tool(func_callable=func)


async def _batch(tool: Tool, arguments: Sequence[dict[str, Any]]) -> list[FunctionCalling]:
    calls = [FunctionCalling(func_tool=tool, arguments=a) for a in arguments]
    await asyncio.gather(*(c.invoke() for c in calls))
    return calls


def run_batch(func: Callable[..., Any], arguments: Sequence[dict[str, Any]]) -> float:
    """Wall seconds for the whole batch, event construction included (the caller pays it)."""
    tool = _tool(func)

    async def main() -> float:
        start = time.perf_counter()
        calls = await _batch(tool, arguments)
        wall_s = time.perf_counter() - start
        _check(calls)
        return wall_s

    return asyncio.run(main())


def run_sequential(func: Callable[..., Any], arguments: Sequence[dict[str, Any]]) -> list[float]:
    """Per-call latency in seconds, one call awaited after the other."""
    tool = _tool(func)

    async def main() -> list[float]:
        latencies = []
        for a in arguments:
            start = time.perf_counter()
            calls = await _batch(tool, [a])
            latencies.append(time.perf_counter() - start)
            _check(calls)
        return latencies

    return asyncio.run(main())


def _check(calls: Sequence[FunctionCalling]) -> None:
    bad = [c for c in calls if c.status is not EventStatus.COMPLETED]
    if bad:
        raise RuntimeError(
            f"{len(bad)} of {len(calls)} in-process calls did not complete; first: "
            f"{bad[0].status.value} {bad[0].execution.error!r}"
        )
