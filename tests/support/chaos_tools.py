"""Tools for the chaos tests: each run writes its own side channel.

Every run appends ``S <token> <pid> <host>`` to a ledger file when it starts and
``E <token> <pid> <host>`` when its side effect is done (``host``: the worker's CHAOS_HOST, so a
test with workers in network namespaces can tell which host ran what). The ledger is a plain
file, not the broker, so a broker restart, stall or outage cannot lose it: the test counts what
really ran, whatever Redis remembers.
Workers load this module with --tools.
"""

from __future__ import annotations

import asyncio
import os
import time

from toolfleet.workers.registry import tool

__all__ = ["chaos_async", "chaos_async_once", "chaos_sync", "chaos_sync_once"]


def _mark(ledger: str, phase: str, token: int) -> None:
    # One O_APPEND write of a short line is atomic: concurrent runs never interleave a line.
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        host = os.environ.get("CHAOS_HOST", "-")
        os.write(fd, f"{phase} {token} {os.getpid()} {host}\n".encode())
    finally:
        os.close(fd)


@tool
def chaos_sync(ledger: str, token: int, seconds: float) -> int:
    """Not idempotent: a second run of one token would repeat its side effect."""
    _mark(ledger, "S", token)
    time.sleep(seconds)
    _mark(ledger, "E", token)
    return token


@tool(idempotent=True)
def chaos_sync_once(ledger: str, token: int, seconds: float) -> int:
    """Declared safe to re-run after its worker is lost (never after it finished)."""
    _mark(ledger, "S", token)
    time.sleep(seconds)
    _mark(ledger, "E", token)
    return token


@tool
async def chaos_async(ledger: str, token: int, seconds: float) -> int:
    """Not idempotent, async."""
    _mark(ledger, "S", token)
    await asyncio.sleep(seconds)
    _mark(ledger, "E", token)
    return token


@tool(idempotent=True)
async def chaos_async_once(ledger: str, token: int, seconds: float) -> int:
    """Idempotent, async."""
    _mark(ledger, "S", token)
    await asyncio.sleep(seconds)
    _mark(ledger, "E", token)
    return token
