"""Soak-test tools: each run of a call adds 1 to its token's counter, so a re-run shows up.

Registered for toolfleet workers with ``--tools bench.soak_tools``; the counters live in the
fleet's own Redis (``TOOLFLEET_BROKER_URL``) under :data:`RUNS_KEY`.
"""

from __future__ import annotations

import asyncio
import os

import redis
import redis.asyncio as aioredis

from toolfleet.workers.registry import tool

__all__ = ["RUNS_KEY", "soak_async", "soak_sync"]

RUNS_KEY = "bench:soak:runs"

_sync_client: redis.Redis | None = None
_async_clients: dict[int, aioredis.Redis] = {}


def _url() -> str:
    return os.environ.get("TOOLFLEET_BROKER_URL", "redis://127.0.0.1:6379/0")


@tool
def soak_sync(token: int) -> int:
    global _sync_client
    if _sync_client is None:  # per process: created after the prefork fork
        _sync_client = redis.Redis.from_url(_url())
    _sync_client.hincrby(RUNS_KEY, str(token), 1)
    return token


@tool
async def soak_async(token: int) -> int:
    # A client cannot cross event loops; the asyncio pool has one loop per worker.
    loop_id = id(asyncio.get_running_loop())
    client = _async_clients.get(loop_id)
    if client is None:
        client = _async_clients[loop_id] = aioredis.Redis.from_url(_url())
    await client.hincrby(RUNS_KEY, str(token), 1)
    return token
