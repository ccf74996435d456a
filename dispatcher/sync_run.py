"""Running one coroutine to completion from synchronous code (issue 14 item 7).

A script has no event loop: the coroutine runs on a private one (``asyncio.run``), and the
fleet's clients bound to that loop are closed before it ends. Code that already runs a loop
in this thread (a notebook, an async framework calling sync code) cannot block on it, so the
coroutine then runs on a private loop in a helper thread while this thread waits.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["run_sync"]

T = TypeVar("T")


def run_sync(
    make: Callable[[], Coroutine[Any, Any, T]], *, close: Callable[[], Coroutine[Any, Any, None]]
) -> T:
    """``make()`` run on a private event loop; ``close()`` awaited on that loop afterwards
    (also after an error or KeyboardInterrupt), so nothing opened for it outlives it."""

    async def main() -> T:
        try:
            return await make()
        finally:
            await close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    return _in_thread(main)


def _in_thread(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append((True, asyncio.run(main())))
        except BaseException as exc:  # re-raised in the caller's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=target, name="toolfleet-act-sync", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
