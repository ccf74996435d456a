"""Workers for the agent-framework adapters' tests: a sync worker (concurrency 8) and an async
worker on queues of their own, loading ``tests.support.sample_tools`` and
``tests.support.agent_tools``; and a helper that tells whether a pid is one of their
processes."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import redis

from tests.support.fleet import WorkerProcess, own_queues, start_worker
from tests.support.waiting import until_async
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings

__all__ = ["AgentFleet", "agent_fleet", "cancel_once_running"]

TOOLS = ("tests.support.sample_tools", "tests.support.agent_tools")


@dataclass
class AgentFleet:
    settings: Settings
    sync: WorkerProcess
    async_: WorkerProcess

    def runs_in_a_worker(self, pid: int) -> bool:
        """``pid`` is one of the workers' processes (a prefork child or the asyncio pool)."""
        if pid == os.getpid():
            return False
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return False
        return group in (self.sync.pid, self.async_.pid)


@contextmanager
def agent_fleet(fleet_settings: Settings, redis_url: str, name: str) -> Iterator[AgentFleet]:
    settings, env = own_queues(fleet_settings, name, tools=TOOLS)
    sync = start_worker("sync", redis_url=redis_url, tools=TOOLS, concurrency=8, env=env)
    try:
        async_ = start_worker("async", redis_url=redis_url, tools=TOOLS, env=env)
    except BaseException:
        sync.stop(timeout_s=5)
        raise
    try:
        yield AgentFleet(settings, sync, async_)
    finally:
        async_.stop(timeout_s=10)
        sync.stop(timeout_s=10)


async def cancel_once_running(
    task: asyncio.Future[object], started: list[str], client: redis.Redis, keys: Keys
) -> float:
    """Once two calls (``started``, their call ids) run on a worker, cancel the agent's
    ``task``; how long it took to end after the cancel."""
    await until_async(
        lambda: len(started) == 2 and all(client.exists(keys.started(c)) for c in started),
        timeout_s=15,
        interval_s=0.02,
        what="both calls running on the async worker",
        while_running=task,
    )
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return time.monotonic() - cancelled_at
