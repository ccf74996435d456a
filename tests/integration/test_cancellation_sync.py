"""Cancellation truth for sync calls (C9), with a real prefork worker.

A running sync call cannot be stopped on its worker (killing a prefork child mid-call could
leave a half-done side effect), so a cancel or a batch deadline leaves it running. Its history
must say so: the event records that it was stopped while running and on which worker, and once
the worker finishes, the worker's own record of that run is attached to the event as
``late_result`` (Branch.load), so a side effect that happened is visible.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.cli_support import REPO_ROOT, as_at_a_terminal, killed_on_exit
from tests.support.fleet import WorkerProcess, call, start_worker
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until, until_async
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.slow

TOOLS = ("tests.support.sample_tools", "tests.support.reliability_tools")


@pytest.fixture()
def worker(broker: PrivateRedis) -> Iterator[WorkerProcess]:
    started = start_worker("sync", redis_url=broker.url, concurrency=1, tools=TOOLS)
    yield started
    started.stop(timeout_s=5)


def _running(client: redis.Redis) -> bool:
    return any(True for _ in client.scan_iter(match=Keys().started("*")))


def _late_event(settings: Settings, branch_id: str) -> EventRecord:
    async def load() -> EventRecord:
        async with Fleet(settings) as fleet:
            return (await Branch.load(branch_id, fleet=fleet)).events[0]

    return asyncio.run(load())


def _assert_truth(
    settings: Settings, branch: Branch, worker: WorkerProcess, mark: Path, status: str
) -> None:
    event = branch.events[0]
    assert event.execution["status"] == status
    assert event.stopped_while_running == worker.hostname
    error = str(event.execution["error"])
    assert f"already running on worker {worker.hostname}" in error, error
    assert "late_result" in error
    # The worker ran on and finished: its side effect happened once ...
    until(mark.exists, timeout_s=20, what="the sync call to finish on its worker")
    assert len(mark.read_text().splitlines()) == 1
    # ... and the stored history says so, with the worker's own record of the run.
    stored = until(
        lambda: _late_event(settings, branch.id).late_result and _late_event(settings, branch.id),
        timeout_s=20,
        what="the late result to be attached",
    )
    assert stored.execution["status"] == status  # the dispatcher's record still stands
    late = stored.late_result
    assert late["worker"] == worker.hostname
    assert late["execution"]["status"] == EventStatus.COMPLETED.value
    assert late["execution"]["response"] == 1


def test_a_cancelled_running_sync_call_records_that_it_ran_on_and_completed(
    broker: PrivateRedis, worker: WorkerProcess, tmp_path: Path
) -> None:
    settings = Settings(broker_url=broker.url, tools=TOOLS)
    mark = tmp_path / "mark"

    async def scenario() -> Branch:
        async with Fleet(settings) as fleet:
            branch = Branch(fleet=fleet)
            task = asyncio.ensure_future(
                branch.act([call("sleep_then_mark", path=str(mark), seconds=2.0)])
            )
            with broker.client() as client:
                await until_async(
                    lambda: _running(client),
                    timeout_s=20,
                    interval_s=0.02,
                    what="the sync call to start",
                    while_running=task,
                )
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return branch

    branch = asyncio.run(asyncio.wait_for(scenario(), 40))
    assert not mark.exists()  # act() returned at the cancel, before the call ended
    _assert_truth(settings, branch, worker, mark, EventStatus.CANCELLED.value)


def test_a_sync_call_past_the_batch_deadline_records_that_it_ran_on_and_completed(
    broker: PrivateRedis, worker: WorkerProcess, tmp_path: Path
) -> None:
    settings = Settings(broker_url=broker.url, tools=TOOLS)
    mark = tmp_path / "mark"

    async def scenario() -> tuple[Branch, list[ActionResponseModel]]:
        async with Fleet(settings) as fleet:
            branch = Branch(fleet=fleet)
            results = await branch.act(
                [call("sleep_then_mark", path=str(mark), seconds=3.0)],
                call_params=CallParams(deadline_s=1.0),
            )
            return branch, results

    branch, [result] = asyncio.run(asyncio.wait_for(scenario(), 40))
    assert result.status is EventStatus.FAILED
    assert result.error is not None and result.error.startswith("ToolTimeoutError")
    assert not mark.exists()
    _assert_truth(settings, branch, worker, mark, EventStatus.FAILED.value)


_ACT_SYNC_SCRIPT = """
import json, os, sys
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.settings import Settings

broker_url, mark = sys.argv[1], sys.argv[2]
fleet = Fleet(Settings(broker_url=broker_url, tools={tools!r}))
branch = Branch(fleet=fleet)
first = branch.act_sync([{"function": "add", "arguments": {"a": 1, "b": 2}}])
open(mark + ".first", "w").close()  # the test interrupts the second act_sync, not this one
try:
    branch.act_sync([{"function": "sleep_then_mark", "arguments": {"path": mark, "seconds": 3.0}}])
    interrupted = False
except KeyboardInterrupt:
    interrupted = True
print(json.dumps({
    "interrupted": interrupted,
    "mark_existed": os.path.exists(mark),
    "branch": branch.id,
    "first": [r.output for r in first],
    "loops_bound": fleet.loops_bound,
    "statuses": [e.execution["status"] for e in branch.events],
}), flush=True)
"""


def test_ctrl_c_inside_act_sync_raises_keyboardinterrupt_and_records_the_running_call(
    broker: PrivateRedis, worker: WorkerProcess, tmp_path: Path
) -> None:
    """A script's Ctrl-C while ``act_sync`` waits on a running sync call: KeyboardInterrupt
    reaches the script at once (not when the call ends), the earlier batch keeps its result,
    the running call is recorded CANCELLED with its linked pair, and the private loop's
    clients are closed (``loops_bound == 0``)."""
    settings = Settings(broker_url=broker.url, tools=TOOLS)
    mark = tmp_path / "mark"
    script = tmp_path / "script.py"
    script.write_text(_ACT_SYNC_SCRIPT.replace("{tools!r}", repr(TOOLS)))
    with killed_on_exit(
        subprocess.Popen(
            [sys.executable, str(script), broker.url, str(mark)],
            preexec_fn=as_at_a_terminal,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    ) as proc:
        with broker.client() as client:
            # The first batch's call is running for a moment too: wait for the second's.
            first_done = tmp_path / "mark.first"
            until(
                lambda: first_done.exists() and _running(client),
                timeout_s=30,
                what="the second act_sync's sync call to start",
            )
        assert proc.poll() is None, "the script ended before it was interrupted"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["interrupted"] is True
    assert report["mark_existed"] is False  # act_sync returned at the Ctrl-C
    assert report["first"] == [3]
    assert report["loops_bound"] == 0
    assert report["statuses"] == [EventStatus.COMPLETED.value, EventStatus.CANCELLED.value]

    async def load() -> Branch:
        async with Fleet(settings) as fleet:
            return await Branch.load(report["branch"], fleet=fleet)

    stored = asyncio.run(load())
    assert [e.execution["status"] for e in stored.events] == report["statuses"]
    assert len(stored.messages) == 4  # two linked request/response pairs
    until(mark.exists, timeout_s=20, what="the sync call to finish on its worker")
