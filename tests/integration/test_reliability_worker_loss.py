"""Worker loss mid-batch (C7), with ``acks_late`` and ``reject_on_worker_lost``.

A SIGKILLed prefork child, and a SIGKILLed whole worker: the non-idempotent call that was running
ends FAILED with WorkerLostError (its side effect happened once, it is not re-run); an
``idempotent=True`` call that was running, and calls that had not started, run again on a
surviving worker. Every call ends terminal before the batch deadline.

Each test has a private redis-server, so the short visibility timeout its workers need never
redelivers another test's long calls.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from tests.support.fleet import WorkerProcess, assert_linked_pairs, call, start_worker
from tests.support.redis_server import PrivateRedis
from tests.support.reliability_support import kill_pid
from tests.support.waiting import until_async
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.slow

TOOLS = ("tests.support.sample_tools", "tests.support.reliability_tools")
# Redis hands an unacked message of a dead worker to another after this long.
ENV = {"TOOLFLEET_VISIBILITY_TIMEOUT_S": "2"}
DEADLINE_S = 40.0


def runs(path: Path) -> list[int]:
    """The PIDs of the processes that ran the tool writing ``path``, one per run."""
    if not path.exists():
        return []
    return [int(line.split()[1]) for line in path.read_text().splitlines()]


def assert_every_call_answered(branch: Branch, results: list[ActionResponseModel]) -> None:
    assert_linked_pairs(branch, results)
    assert all(result.status.is_terminal for result in results)


def test_a_killed_prefork_child_fails_its_running_call_and_reruns_only_what_is_safe(
    broker: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    worker = start_worker("sync", redis_url=broker.url, concurrency=2, tools=TOOLS, env=ENV)
    workers.append(worker)
    settings = Settings(broker_url=broker.url, tools=TOOLS)
    lost, rerun, queued = (tmp_path / n for n in ("lost", "rerun", "queued"))
    requests = [
        call("mark_then_sleep", path=str(lost), seconds=30),  # running, not idempotent
        call("mark_then_sleep_once", path=str(rerun), seconds=30),  # running, idempotent
        call("append_line", path=str(queued), text="x"),  # queued behind both
    ]

    async def scenario() -> tuple[Branch, list[ActionResponseModel], float]:
        async with Fleet(settings) as fleet:
            branch = Branch(fleet=fleet)
            started = time.monotonic()
            task = asyncio.ensure_future(
                branch.act(requests, call_params=CallParams(deadline_s=DEADLINE_S))
            )
            await until_async(
                lambda: runs(lost) and runs(rerun),
                timeout_s=20,
                interval_s=0.02,
                what="both calls to run",
                while_running=task,
            )
            for pid in (*runs(lost), *runs(rerun)):
                assert pid != worker.pid  # a prefork child, not the worker itself
                kill_pid(pid)
            results = await task
            return branch, results, time.monotonic() - started

    branch, results, elapsed_s = asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S + 10))

    assert elapsed_s < DEADLINE_S
    failed, completed, done = results
    assert failed.status is EventStatus.FAILED
    assert failed.error is not None and failed.error.startswith("WorkerLostError: ")
    assert "not re-run because the tool is not idempotent=True" in failed.error
    assert len(runs(lost)) == 1  # its side effect happened once
    assert completed.status is EventStatus.COMPLETED and completed.output == 2
    assert len(runs(rerun)) == 2  # re-run in a fresh child
    assert done.status is EventStatus.COMPLETED and queued.read_text() == "x\n"
    assert_every_call_answered(branch, results)
    print("prefork child killed: 1 FAILED (WorkerLostError), 1 re-run, 1 queued call run once")


def test_a_killed_worker_fails_its_running_call_and_a_survivor_reruns_the_rest(
    broker: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    # The doomed worker reserves 4 calls (2 running, 2 prefetched but not started).
    doomed = start_worker(
        "sync",
        redis_url=broker.url,
        concurrency=2,
        tools=TOOLS,
        env={**ENV, "TOOLFLEET_SYNC_PREFETCH": "2"},
    )
    workers.append(doomed)
    settings = Settings(broker_url=broker.url, tools=TOOLS)
    lost, rerun, first, second = (tmp_path / n for n in ("lost", "rerun", "first", "second"))
    requests = [
        call("mark_then_sleep", path=str(lost), seconds=30),
        call("mark_then_sleep_once", path=str(rerun), seconds=30),
        call("append_line", path=str(first), text="x"),  # reserved by the doomed worker
        call("append_line", path=str(second), text="x"),  # reserved by the doomed worker
    ]

    async def scenario() -> tuple[Branch, list[ActionResponseModel], float]:
        async with Fleet(settings) as fleet:
            queue = settings.sync_queue
            branch = Branch(fleet=fleet)
            started = time.monotonic()
            task = asyncio.ensure_future(
                branch.act(requests, call_params=CallParams(deadline_s=DEADLINE_S))
            )
            client = fleet.redis
            await until_async(
                lambda: runs(lost) and runs(rerun),
                timeout_s=20,
                interval_s=0.02,
                what="both calls to run",
                while_running=task,
            )
            # Every message delivered (none left in the queue list) before the crash.

            async def all_reserved() -> bool:
                return not await client.llen(queue)

            await until_async(
                all_reserved,
                timeout_s=10,
                interval_s=0.02,
                what="the doomed worker to reserve every call",
            )
            assert not first.exists() and not second.exists()
            # The survivor joins once the doomed worker holds every call, and is up (it
            # answered a ping) when the doomed worker dies.
            workers.append(
                await asyncio.to_thread(
                    start_worker, "sync", redis_url=broker.url, concurrency=2, tools=TOOLS, env=ENV
                )
            )
            await asyncio.to_thread(doomed.kill)
            results = await task
            return branch, results, time.monotonic() - started

    branch, results, elapsed_s = asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S + 10))

    assert elapsed_s < DEADLINE_S
    survivor = workers[1]
    failed, completed, ran_first, ran_second = results
    assert failed.status is EventStatus.FAILED
    assert failed.error is not None and failed.error.startswith("WorkerLostError: ")
    assert doomed.hostname in failed.error
    assert len(runs(lost)) == 1
    assert completed.status is EventStatus.COMPLETED and completed.output == 2
    assert len(runs(rerun)) == 2
    for result, path in ((ran_first, first), (ran_second, second)):
        assert result.status is EventStatus.COMPLETED
        assert path.read_text() == "x\n"  # not started before the crash: run exactly once
    # Everything after the crash ran on the survivor.
    assert {e.worker for e in branch.events} == {survivor.hostname}
    assert os.path.exists(lost)
    assert_every_call_answered(branch, results)
    print("worker killed: 1 FAILED (WorkerLostError), 1 re-run, 2 unstarted calls run once")
