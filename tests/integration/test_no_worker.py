"""A call on a queue that no live worker consumes: it fails instead of waiting forever.

The dispatcher warns at once, naming the queue and the command that starts a worker for it;
after TOOLFLEET_NO_WORKER_TIMEOUT_S with still no worker, the calls end FAILED with a
NoWorkerError naming the queue, their record is stored and they are revoked, and act()
returns. With the timeout 0 the calls wait, and run once a worker turns up.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid

import pytest
import redis

from tests.support.fleet import WorkerProcess, assert_linked_pairs, call, run, start_worker
from tests.support.waiting import until_async
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.watch.reconciler import start_command
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallResult


def _lonely(settings: Settings, timeout_s: float) -> Settings:
    queue = f"toolfleet.async.nobody-{uuid.uuid4().hex[:8]}"
    return settings.model_copy(update={"async_queue": queue, "no_worker_timeout_s": timeout_s})


def test_start_command_names_the_queue_when_it_is_not_the_default() -> None:
    settings = Settings(async_queue="toolfleet.async.gpu")
    assert start_command(settings, "toolfleet.async.gpu") == (
        "TOOLFLEET_ASYNC_QUEUE=toolfleet.async.gpu toolfleet worker --kind async"
    )
    assert start_command(Settings(), "toolfleet.sync") == "toolfleet worker --kind sync"


@pytest.mark.slow
def test_a_kind_without_worker_warns_at_once_then_fails_no_worker_error(
    fleet_settings: Settings,
    sync_worker: WorkerProcess,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = _lonely(fleet_settings, timeout_s=2.0)
    queue = settings.async_queue
    warned_after: list[float] = []

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel], float]:
        branch = Branch(fleet=fleet)
        started = time.monotonic()
        task = asyncio.ensure_future(
            branch.act([call("echo", value=1), call("sleep_async", seconds=0.1)])
        )
        await until_async(
            lambda: any(queue in r.getMessage() for r in caplog.records),
            timeout_s=5,
            interval_s=0.02,
            what="a warning about the queue without a worker",
        )
        warned_after.append(time.monotonic() - started)
        results = await task
        return branch, results, time.monotonic() - started

    with caplog.at_level(logging.WARNING, logger="toolfleet.dispatcher"):
        branch, results, elapsed_s = run(settings, scenario, timeout_s=30)

    warning = next(r.getMessage() for r in caplog.records if queue in r.getMessage())
    assert "toolfleet worker --kind async" in warning
    assert warned_after[0] < 1.5, f"warned only after {warned_after[0]:.1f}s"
    assert elapsed_s < 2.0 + 6.0, f"act() took {elapsed_s:.1f}s for a 2 s no-worker timeout"
    echo, lonely = results
    assert echo.status is EventStatus.COMPLETED
    assert lonely.status is EventStatus.FAILED
    assert lonely.error is not None and lonely.error.startswith("NoWorkerError")
    assert queue in lonely.error and "toolfleet worker --kind async" in lonely.error
    assert_linked_pairs(branch, results)
    # The record is stored FAILED, so a worker that turns up later does not run the call.
    raw = redis_client.get(Keys().event(lonely.call_id or ""))
    assert raw is not None
    assert CallResult.model_validate_json(raw).status is EventStatus.FAILED


@pytest.mark.slow
def test_with_timeout_zero_the_call_waits_and_runs_when_a_worker_starts(
    fleet_settings: Settings, redis_url: str, workers: list[WorkerProcess]
) -> None:
    settings = _lonely(fleet_settings, timeout_s=0)

    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        branch = Branch(fleet=fleet)
        task = asyncio.ensure_future(branch.act(call("sleep_async", seconds=0.1)))
        # Longer than a non-zero timeout would allow, then a worker for the queue starts.
        await asyncio.sleep(2.5)
        assert not task.done(), task
        env = {"TOOLFLEET_ASYNC_QUEUE": settings.async_queue}
        workers.append(
            await asyncio.to_thread(
                start_worker, "async", redis_url=redis_url, concurrency=10, env=env
            )
        )
        return await asyncio.wait_for(task, 30)

    [result] = run(settings, scenario, timeout_s=90)
    assert result.status is EventStatus.COMPLETED, result.error


def test_toolfleet_run_prints_the_warning_above_its_progress_bar() -> None:
    import io

    from rich.console import Console

    from toolfleet.cli.progress import BatchProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with BatchProgress(2, console):
        logging.getLogger("toolfleet.dispatcher.watch.reconciler").warning(
            "no live worker consumes queue 'toolfleet.async'; start one with `%s`",
            "toolfleet worker --kind async",
        )
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "warning: no live worker consumes queue 'toolfleet.async'" in text
    assert "toolfleet worker --kind async" in text
    assert not logging.getLogger("toolfleet.dispatcher").handlers, "the handler outlived the bar"
