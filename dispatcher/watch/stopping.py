"""Stopping a background task for sure, even when a library swallowed its cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel_and_wait", "raise_if_cancelled"]

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


def raise_if_cancelled() -> None:
    """In a background loop's error handler: raise ``CancelledError`` if this task was
    cancelled, whatever error the cancel came out as.

    ``cancel_and_wait`` re-cancels, but ``asyncio.run`` cancels a loop's leftover tasks only
    once: a loop that caught its cancel as a redis-py error and went on kept ``asyncio.run``
    from returning (tests/integration/test_sync_api.py hung on it in CI).
    ``Task.cancelling()`` stays set however the cancel was caught.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
