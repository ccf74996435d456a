"""Running one coroutine to completion from synchronous code: ``Branch.act_sync``.

A script has no event loop: the coroutine runs on a private one (``asyncio.run``, which runs
it in a copy of the caller's context, so contextvars and the OpenTelemetry context carry over),
and the fleet's clients bound to that loop are closed before it ends. Code that already runs a
loop in this thread must ``await branch.act(...)``: blocking that loop until the batch ends
would stall every other task on it, so act_sync refuses, as ``asyncio.run`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from toolfleet.schemas.errors import UsageError

__all__ = ["run_sync"]

T = TypeVar("T")


def run_sync(
    make: Callable[[], Coroutine[Any, Any, T]], *, close: Callable[[], Coroutine[Any, Any, None]]
) -> T:
    """``make()`` run on a private event loop; ``close()`` awaited on that loop afterwards
    (also after an error or KeyboardInterrupt), so nothing opened for it outlives it.

    Raises RuntimeError, before anything is sent, when this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise UsageError(
            "act_sync() cannot be called from a running event loop: it would block every "
            "other task of that loop until the batch ends; use `await branch.act(...)` "
            "there, or call act_sync from a thread that runs no loop "
            "(`await asyncio.to_thread(branch.act_sync, ...)`)"
        )

    async def main() -> T:
        try:
            return await make()
        finally:
            await close()

    return asyncio.run(main())
