"""Tools shared by every engineer's tests. Workers load this module with --tools."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import Any

from toolfleet.workers.current_call import current_call
from toolfleet.workers.registry import tool

__all__ = [
    "add",
    "append_line",
    "append_line_idempotent",
    "append_then_sleep",
    "blocks_loop",
    "count_async",
    "count_sync",
    "count_sync_idempotent",
    "echo",
    "fail",
    "fail_async",
    "loaded_modules",
    "loaded_modules_async",
    "returns_awaitable",
    "returns_none",
    "sleep_async",
    "sleep_sync",
    "slow_async",
    "slow_sync",
    "stubborn_sync",
    "whoami",
    "whoami_async",
    "with_secret",
]


@tool
def echo(value: Any = None) -> Any:
    return value


@tool
def add(a: float, b: float) -> float:
    return a + b


@tool
def sleep_sync(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@tool
async def sleep_async(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@tool
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@tool
async def fail_async(message: str = "boom") -> None:
    raise ValueError(message)


@tool
def returns_none() -> None:
    return None


@tool(timeout_s=0.5)
def slow_sync(seconds: float = 5.0) -> float:
    """Blocks past its 0.5 s timeout: the sync worker's soft time limit must stop it."""
    time.sleep(seconds)
    return seconds


@tool(timeout_s=0.5)
async def slow_async(seconds: float = 5.0) -> float:
    """Awaits past its 0.5 s timeout: the asyncio pool must cancel it."""
    await asyncio.sleep(seconds)
    return seconds


@tool(secret_args=("api_key",))
def with_secret(query: str, api_key: str) -> dict[str, Any]:
    """Uses a secret; returns only its length, so the result never carries it."""
    return {"query": query, "api_key_length": len(api_key)}


@tool
def append_line(path: str, text: str) -> int:
    """A side effect that must not happen twice (not idempotent): one line per run."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(text + "\n")
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


@tool(idempotent=True)
def append_line_idempotent(path: str, text: str) -> int:
    """Same effect, declared safe to re-run after a lost worker."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(text + "\n")
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def _coroutine_returner() -> Any:
    async def inner() -> int:
        return 1

    return inner()


@tool(name="returns_awaitable")
def returns_awaitable() -> Any:
    """Declared sync but returns an awaitable: must FAIL with a TypeError (C6)."""
    return _coroutine_returner()


@tool
def whoami() -> dict[str, int]:
    return {"pid": os.getpid(), "thread": threading.get_ident()}


@tool
async def whoami_async(delay_s: float = 0.0) -> dict[str, int]:
    if delay_s:
        await asyncio.sleep(delay_s)
    return {"pid": os.getpid(), "thread": threading.get_ident()}


@tool
def append_then_sleep(path: str, seconds: float) -> float:
    """Leaves a mark, then blocks: lets a test kill its worker mid-call (not idempotent)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("started\n")
    time.sleep(seconds)
    return seconds


@tool(timeout_s=0.5)
def stubborn_sync(seconds: float = 30.0) -> float:
    """Swallows the soft time limit and keeps blocking: only the hard limit stops it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(max(0.0, deadline - time.monotonic()))
        except Exception:  # SoftTimeLimitExceeded, deliberately ignored
            continue
    return seconds


@tool
def loaded_modules(prefix: str) -> list[str]:
    """The modules under ``prefix`` this worker process has imported."""
    return sorted(name for name in sys.modules if name == prefix or name.startswith(prefix + "."))


@tool
async def loaded_modules_async(prefix: str) -> list[str]:
    """The same, from the asyncio pool (the worker's main process)."""
    return loaded_modules(prefix)


@tool
async def blocks_loop(seconds: float) -> float:
    """Wrongly blocks its event loop (time.sleep inside async def): the pool must name it."""
    time.sleep(seconds)  # noqa: ASYNC251 - the blocking call is what this tool is for
    return seconds


# Progress (docs/controls.md): each reports step i of n, ``delay_s`` apart.


@tool
def count_sync(n: int, delay_s: float = 0.0) -> int:
    call = current_call()
    for i in range(1, n + 1):
        if delay_s:
            time.sleep(delay_s)
        call.progress(i, total=n, message=f"step {i} of {n}")
    return n


@tool(idempotent=True)
def count_sync_idempotent(n: int, delay_s: float = 0.0) -> int:
    return count_sync(n, delay_s)


@tool
async def count_async(n: int, delay_s: float = 0.0) -> int:
    call = current_call()
    for i in range(1, n + 1):
        if delay_s:
            await asyncio.sleep(delay_s)
        call.progress(i, total=n, message=f"step {i} of {n}")
    return n
