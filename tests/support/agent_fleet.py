"""Workers for the agent-framework adapters' tests: a sync worker (concurrency 8) and an async
worker on queues of their own, loading ``tests.support.sample_tools`` and
``tests.support.agent_tools``; and a helper that tells whether a pid is one of their
processes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.fleet import WorkerProcess, start_worker
from toolfleet.schemas.settings import Settings

__all__ = ["AgentFleet", "agent_fleet"]

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
    suffix = f"{name}-{uuid.uuid4().hex[:8]}"
    settings = fleet_settings.model_copy(
        update={
            "sync_queue": f"toolfleet.sync.{suffix}",
            "async_queue": f"toolfleet.async.{suffix}",
            "tools": TOOLS,
        }
    )
    env = {
        "TOOLFLEET_RESULT_BACKEND": fleet_settings.result_backend or "",
        "TOOLFLEET_SYNC_QUEUE": settings.sync_queue,
        "TOOLFLEET_ASYNC_QUEUE": settings.async_queue,
    }
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
