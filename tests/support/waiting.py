"""Waiting for a condition with a deadline: the one poll every test, helper and bench uses.

``until`` polls from plain code; ``until_async`` polls from a coroutine without blocking the
loop (its predicate may be a coroutine function, and it may watch a task that must not end
first). Both return the predicate's first truthy value and raise ``TimeoutError`` naming what
was awaited once ``timeout_s`` has passed.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["until", "until_async"]

T = TypeVar("T")

What = str | Callable[[], str]


def _timed_out(timeout_s: float, what: What, predicate: object) -> TimeoutError:
    described = what() if callable(what) else what
    return TimeoutError(f"timed out after {timeout_s:g}s waiting for {described or predicate}")


def until(
    predicate: Callable[[], T],
    *,
    timeout_s: float,
    interval_s: float = 0.05,
    what: What = "",
) -> T:
    """Poll ``predicate`` every ``interval_s`` until it returns a truthy value, and return it.

    ``what`` says what is awaited, for the error; a callable is asked only on a timeout (so the
    error can list what was still wrong at that moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout_s, what, predicate)
        time.sleep(interval_s)


async def until_async(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float,
    interval_s: float = 0.05,
    what: What = "",
    while_running: asyncio.Future[Any] | None = None,
) -> T:
    """``until`` for a coroutine: the predicate may return an awaitable (it is awaited), and
    the wait fails at once if ``while_running`` (the batch under test) ends first."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if while_running is not None and while_running.done():
            described = what() if callable(what) else what
            raise AssertionError(f"the task ended before {described}: {while_running}")
        if time.monotonic() > deadline:
            raise _timed_out(timeout_s, what, predicate)
        await asyncio.sleep(interval_s)
