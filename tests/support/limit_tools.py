"""Tools for the tests of the fleet-wide controls and the effect key; workers load this module
with --tools.

Every run writes its own side channel, a plain file (``side``) the test reads, not the broker:
``S <token> <epoch s> <pid> <host> <scope>`` when it starts and ``E ...`` when it ends (one
O_APPEND write per line, atomic), so the test sees what really ran, and when, on every host.
The effect-key tools append ``<key> <pid>`` lines instead.
"""

from __future__ import annotations

import asyncio
import os
import time

from toolfleet import current_call
from toolfleet.workers.registry import tool

__all__ = [
    "capped_async",
    "capped_chaos",
    "capped_chaos_read_only",
    "capped_sync",
    "capped_with_timeout",
    "effect_key_async",
    "effect_key_flaky",
    "effect_key_sync",
    "per_tenant_async",
    "rated_async",
    "rated_slowly",
    "rated_sync",
    "read_only_key",
]


def mark(side: str, phase: str, token: int, scope: str = "-") -> None:
    host = os.environ.get("CHAOS_HOST", "-")
    line = f"{phase} {token} {time.time():.6f} {os.getpid()} {host} {scope}\n"
    fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _append(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# --- rate limits ---


@tool(rate_limit="20/s", limit_key="tenant")
async def rated_async(side: str, token: int, tenant: str) -> int:
    mark(side, "S", token, tenant)
    return token


@tool(rate_limit="10/s", limit_key="tenant")
def rated_sync(side: str, token: int, tenant: str) -> int:
    mark(side, "S", token, tenant)
    return token


@tool(rate_limit="1/h", limit_key="tenant")
async def rated_slowly(tenant: str) -> str:
    """One call an hour per tenant: the second waits past any test's limit_wait_s."""
    return tenant


# --- concurrency caps ---


@tool(max_concurrency=2)
async def capped_async(side: str, token: int, seconds: float) -> int:
    mark(side, "S", token)
    await asyncio.sleep(seconds)
    mark(side, "E", token)
    return token


@tool(max_concurrency=2)
def capped_sync(side: str, token: int, seconds: float) -> int:
    mark(side, "S", token)
    time.sleep(seconds)
    mark(side, "E", token)
    return token


@tool(max_concurrency=1, timeout_s=1.0)
def capped_with_timeout(side: str, token: int, seconds: float) -> int:
    """One at a time, each with 1 s to run: the wait for the slot is not part of it."""
    mark(side, "S", token)
    time.sleep(seconds)
    mark(side, "E", token)
    return token


@tool(max_concurrency=1, limit_key="tenant")
async def per_tenant_async(side: str, token: int, tenant: str, seconds: float) -> int:
    mark(side, "S", token, tenant)
    await asyncio.sleep(seconds)
    mark(side, "E", token, tenant)
    return token


# --- chaos: a cap across hosts while workers die (ledger lines for the chaos judge too) ---


def _chaos_run(function: str, ledger: str, token: int, seconds: float) -> int:
    from tests.support.chaos_tools import _mark  # the judge's ledger format

    _mark(ledger, "S", token)
    mark(ledger + ".times", "S", token, function)
    time.sleep(seconds)
    mark(ledger + ".times", "E", token, function)
    _mark(ledger, "E", token)
    return token


@tool(max_concurrency=2)
def capped_chaos(ledger: str, token: int, seconds: float) -> int:
    """Not idempotent: lost mid-run, it ends FAILED WorkerLostError."""
    return _chaos_run("capped_chaos", ledger, token, seconds)


@tool(max_concurrency=2, read_only=True, name="capped_chaos_once")
def capped_chaos_read_only(ledger: str, token: int, seconds: float) -> int:
    """Read-only: re-run after its worker is lost (the judge knows it by its "_once" name)."""
    return _chaos_run("capped_chaos_once", ledger, token, seconds)


# --- the effect key ---


@tool
def effect_key_sync(path: str) -> str:
    key = current_call().idempotency_key
    _append(path, f"{key} {os.getpid()}\n")
    return key


@tool
async def effect_key_async(path: str) -> str:
    key = current_call().idempotency_key
    _append(path, f"{key} {os.getpid()}\n")
    return key


@tool
def effect_key_flaky(path: str) -> str:
    """Fails its first run (the file is empty), succeeds after: a retried attempt."""
    key = current_call().idempotency_key
    first = not os.path.exists(path)
    _append(path, f"{key} {os.getpid()}\n")
    if first:
        raise RuntimeError("first attempt fails")
    return key


@tool(read_only=True)
def read_only_key(path: str, seconds: float) -> str:
    """Read-only: a worker lost mid-run re-runs it. Each run appends its key; the first run
    takes ``seconds`` (time to kill its worker), a re-run a moment."""
    key = current_call().idempotency_key
    first = not os.path.exists(path)
    _append(path, f"{key} {os.getpid()}\n")
    time.sleep(seconds if first else 0.1)
    return key
