"""Stopping a background task for sure, even when a library swallowed its cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel_and_wait"]

_RECANCEL_S = 0.1


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and return once it has ended.

    A single ``cancel()`` is not enough for a loop around redis-py: a cancel that races the
    client's socket timeout can come out as ``TimeoutError`` (an ``OSError``), which the
    loop's reconnect handler catches, and the task runs on. So cancel again until it ends.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=_RECANCEL_S)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()  # retrieved, so asyncio does not log "exception never retrieved"
