"""Tools of the ``progress`` workload (``--tools bench.progress_tools``): each reports
``reports`` times, ``gap_s`` apart, through ``current_call().progress()``; ``quiet_sync``
does the same work and reports nothing (the plain path it is compared with)."""

from __future__ import annotations

import asyncio
import time

from toolfleet.workers.current_call import current_call
from toolfleet.workers.registry import tool

__all__ = ["TOOL_MODULE", "quiet_sync", "report_async", "report_sync"]

TOOL_MODULE = __name__


@tool
def report_sync(reports: int, gap_s: float) -> int:
    call = current_call()
    for i in range(1, reports + 1):
        if gap_s:
            time.sleep(gap_s)
        call.progress(i, total=reports)
    return reports


@tool
async def report_async(reports: int, gap_s: float) -> int:
    call = current_call()
    for i in range(1, reports + 1):
        if gap_s:
            await asyncio.sleep(gap_s)
        call.progress(i, total=reports)
    return reports


@tool
def quiet_sync(reports: int, gap_s: float) -> int:
    for _ in range(reports):
        if gap_s:
            time.sleep(gap_s)
    return reports
