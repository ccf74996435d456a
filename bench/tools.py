"""The benchmark tools. Every mode runs these same functions, so only the executor differs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["TOOLS", "echo", "echo_async", "sleep_async", "sleep_sync"]


def echo(value: Any) -> Any:
    """Trivial call: measures pure per-call overhead."""
    return value


async def echo_async(value: Any) -> Any:
    """Trivial coroutine: the per-call overhead of an async tool (the network workload)."""
    return value


def sleep_sync(seconds: float) -> float:
    """Blocking call: holds its worker process (or the caller's event loop) for ``seconds``."""
    time.sleep(seconds)
    return seconds


async def sleep_async(seconds: float) -> float:
    """Non-blocking call: thousands of these can wait at once on one event loop."""
    await asyncio.sleep(seconds)
    return seconds


TOOLS = [echo, echo_async, sleep_sync, sleep_async]
