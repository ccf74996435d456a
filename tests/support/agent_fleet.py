"""Workers for the agent-framework adapters' tests: a sync worker (concurrency 8) and an async
worker on queues of their own, loading ``tests.support.sample_tools`` and
``tests.support.agent_tools``; a helper that tells whether a pid is one of their processes;
and what the adapters' tests check alike: cancelling an agent run, the documented glue.
:func:`cancel_when` serves any test that cancels a task awaiting ``act()``."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from tests.support.fleet import REPO_ROOT, WorkerProcess, own_queues, start_worker
from tests.support.waiting import until_async
from toolfleet.dispatcher import Branch
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings

__all__ = [
    "AgentFleet",
    "agent_fleet",
    "assert_cancelled_everywhere",
    "cancel_once_running",
    "cancel_when",
    "documented_glue",
]

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
def agent_fleet(
    fleet_settings: Settings,
    redis_url: str,
    name: str,
    tools: tuple[str, ...] = TOOLS,
    *,
    more_tools: tuple[str, ...] = (),
) -> Iterator[AgentFleet]:
    """The two workers, loading ``tools`` and ``more_tools`` (a test's own tool modules) on
    queues of their own."""
    tools = (*tools, *more_tools)
    settings, env = own_queues(fleet_settings, name, tools=tools)
    sync = start_worker("sync", redis_url=redis_url, tools=tools, concurrency=8, env=env)
    try:
        async_ = start_worker("async", redis_url=redis_url, tools=tools, env=env)
    except BaseException:
        sync.stop(timeout_s=5)
        raise
    try:
        yield AgentFleet(settings, sync, async_)
    finally:
        async_.stop(timeout_s=10)
        sync.stop(timeout_s=10)


async def cancel_when(
    task: asyncio.Future[Any], ready: Callable[[], object], *, what: str, timeout_s: float = 15
) -> float:
    """Once ``ready()`` holds (``what``, for the error if it never does while ``task`` runs),
    cancel ``task`` and see it end with CancelledError; the ``time.monotonic()`` of the cancel."""
    await until_async(ready, timeout_s=timeout_s, interval_s=0.02, what=what, while_running=task)
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return cancelled_at


async def cancel_once_running(
    task: asyncio.Future[object], started: list[str], client: redis.Redis, keys: Keys
) -> float:
    """Once two calls (``started``, their call ids) run on a worker, cancel the agent's
    ``task``; how long it took to end after the cancel."""
    cancelled_at = await cancel_when(
        task,
        lambda: len(started) == 2 and all(client.exists(keys.started(c)) for c in started),
        what="both calls running on the async worker",
    )
    return time.monotonic() - cancelled_at


def assert_cancelled_everywhere(
    elapsed: float, stored: Branch, started: list[str], client: redis.Redis, keys: Keys
) -> None:
    """C9, after :func:`cancel_once_running` of a turn of two calls ``long_1`` and ``long_2``:
    the run ended within 5 s of the cancel, both calls are CANCELLED in the conversation's
    branch, in the model's order, and in the workers' own records."""
    assert elapsed < 5, elapsed
    assert [e.execution["status"] for e in stored.events] == ["cancelled", "cancelled"]
    assert [m.content.tool_call_id for m in stored.messages[::2]] == ["long_1", "long_2"]
    for call_id in started:  # the workers' own records
        record = client.get(keys.event(call_id))
        assert record is not None and b'"cancelled"' in record


def documented_glue(adapter: str) -> str:
    """docs/agent-ecosystem.md's one code block that imports ``toolfleet.adapters.<adapter>``,
    checked to be at most three lines besides that import."""
    pattern = rf"```python\n(from toolfleet\.adapters\.{adapter} import .*?)```"
    text = (REPO_ROOT / "docs" / "agent-ecosystem.md").read_text(encoding="utf-8")
    [glue] = re.findall(pattern, text, re.DOTALL)
    assert len([line for line in glue.splitlines()[1:] if line.strip()]) <= 3
    return str(glue)
