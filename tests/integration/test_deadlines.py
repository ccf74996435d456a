"""Deadlines: per-call ``timeout_s`` and the batch ``deadline_s``.

When a limit passes, the finished results are returned, each straggler gets a FAILED
ToolTimeoutError response, and it is revoked: a queued straggler never runs.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from celery.result import AsyncResult

from tests.support.fleet import WorkerProcess, assert_linked_pairs, call, run
from tests.support.waiting import until
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

T = TypeVar("T")


def assert_one_linked_pair_per_call(branch: Branch, results: list[ActionResponseModel]) -> None:
    assert_linked_pairs(branch, results)
    responses = branch.messages[1::2]
    assert [m.content.function for m in responses] == [r.function for r in results]
    assert [e.call_id for e in branch.events] == [r.call_id for r in results]


@pytest.mark.usefixtures("async_worker")
def test_batch_deadline_returns_finished_results_and_fails_and_revokes_stragglers(
    lone_sync: tuple[Settings, WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    settings, _worker = lone_sync
    keys = Keys(settings.key_prefix)
    never_written = tmp_path / "queued-straggler.txt"
    requests = [
        call("echo", value="early"),
        call("sleep_async", seconds=0.1),
        call("sleep_async", seconds=30),  # running straggler: cancelled on its worker
        call("sleep_sync", seconds=5),  # running straggler: occupies the only sync slot
        call("append_line", path=str(never_written), text="x"),  # queued straggler
    ]
    # Room for a loaded machine: the running stragglers must have started by the deadline (an
    # async call not yet started when it passes is dropped as revoked, not cancelled running).
    deadline_s = 3.0

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel], float]:
        branch = Branch(fleet=fleet)
        started = time.monotonic()
        results = await branch.act(requests, call_params=CallParams(deadline_s=deadline_s))
        return branch, results, time.monotonic() - started

    branch, results, elapsed_s = run(settings, scenario, timeout_s=30)

    # Returned at the deadline, not after the 30 s straggler (settling takes a moment).
    assert deadline_s <= elapsed_s < deadline_s + 4, elapsed_s
    statuses = [r.status for r in results]
    assert statuses == [EventStatus.COMPLETED] * 2 + [EventStatus.FAILED] * 3
    assert [r.output for r in results[:2]] == ["early", 0.1]
    for straggler in results[2:]:
        assert straggler.error is not None
        assert straggler.error.startswith("ToolTimeoutError: ")
        assert f"deadline_s={deadline_s:g}" in straggler.error
        assert straggler.call_id is not None and straggler.call_id in straggler.error
    assert_one_linked_pair_per_call(branch, results)
    assert [e.execution["status"] for e in branch.events] == [
        "completed",
        "completed",
        "failed",
        "failed",
        "failed",
    ]

    running_async, running_sync, queued = (r.call_id for r in results[2:])
    assert running_async and running_sync and queued
    # The running async straggler is cancelled on its worker, long before its 30 s.
    # Its worker ends it with the dispatcher's record (the first record of an attempt wins),
    # so Celery/Flower show the same failure.
    until(
        lambda: AsyncResult(running_async, app=celery_app).state == "FAILURE",
        # Well short of the straggler's 30 s, with room for a loaded 2-core machine.
        timeout_s=15,
        what="the async straggler to be stopped on its worker",
    )
    stored = redis_client.get(keys.event(running_async))
    assert stored is not None and b"ToolTimeoutError" in stored
    # The queued straggler reaches the worker once the sync slot frees: it is dropped as
    # revoked and never runs.
    until(
        lambda: AsyncResult(queued, app=celery_app).state == "REVOKED",
        timeout_s=15,
        what="the queued straggler to be dropped as revoked",
    )
    assert not never_written.exists()
    # Stopped calls are terminal: none is left counted as running.
    for call_id in (running_async, running_sync, queued):
        assert not redis_client.exists(keys.started(call_id)), call_id


@pytest.mark.usefixtures("sync_worker", "async_worker")
def test_per_call_timeout_fails_slow_calls_alone_with_a_tool_timeout(
    fleet_settings: Settings,
) -> None:
    requests = [
        call("sleep_async", seconds=10),
        call("sleep_sync", seconds=10),
        call("add", a=1, b=2),
        call("sleep_async", seconds=0.05),
    ]

    async def scenario(fleet: Fleet) -> tuple[list[ActionResponseModel], float]:
        started = time.monotonic()
        results = await Branch(fleet=fleet).act(requests, call_params=CallParams(timeout_s=0.5))
        return results, time.monotonic() - started

    results, elapsed_s = run(fleet_settings, scenario, timeout_s=30)

    assert elapsed_s < 6, elapsed_s
    assert [r.status for r in results] == [
        EventStatus.FAILED,
        EventStatus.FAILED,
        EventStatus.COMPLETED,
        EventStatus.COMPLETED,
    ]
    assert [r.output for r in results[2:]] == [3, 0.05]
    for slow in results[:2]:
        assert slow.error is not None and slow.error.startswith("ToolTimeoutError: ")
        # Enforced on the worker: the message names the tool and its limit.
        assert "'sleep_" in slow.error and "0.5" in slow.error


def test_a_call_no_worker_takes_fails_at_its_timeout_and_is_revoked(
    fleet_settings: Settings,
    redis_client: redis.Redis,
) -> None:
    # A queue nobody consumes: only the dispatcher's own bound can end this call.
    orphan_queue = f"toolfleet.async.nobody-{uuid.uuid4().hex[:8]}"
    settings = fleet_settings.model_copy(update={"async_queue": orphan_queue})
    keys = Keys(settings.key_prefix)

    async def scenario(fleet: Fleet) -> tuple[list[ActionResponseModel], float]:
        started = time.monotonic()
        results = await Branch(fleet=fleet).act(
            [call("sleep_async", seconds=0.01)], call_params=CallParams(timeout_s=0.4)
        )
        return results, time.monotonic() - started

    results, elapsed_s = run(settings, scenario, timeout_s=30)

    assert elapsed_s < 5, elapsed_s
    (result,) = results
    assert result.status is EventStatus.FAILED
    assert result.error is not None and result.error.startswith("ToolTimeoutError: ")
    assert "timeout_s=0.4" in result.error and "revoked" in result.error
    # The stored terminal record stops any worker that takes the message later (C7).
    assert result.call_id is not None
    stored = redis_client.get(keys.event(result.call_id))
    assert stored is not None and b'"failed"' in stored
    assert redis_client.llen(orphan_queue) == 1  # still queued, but it can no longer run


@pytest.mark.usefixtures("sync_worker", "async_worker")
def test_sequential_batch_past_its_deadline_never_enqueues_the_rest(
    fleet_settings: Settings, celery_app: Any
) -> None:
    requests = [
        call("echo", value="first"),
        call("sleep_async", seconds=30),  # the straggler
        call("echo", value="never sent"),  # its turn comes after the deadline
    ]

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel], float]:
        branch = Branch(fleet=fleet)
        started = time.monotonic()
        results = await branch.act(
            requests, strategy="sequential", call_params=CallParams(deadline_s=1.0)
        )
        return branch, results, time.monotonic() - started

    branch, results, elapsed_s = run(fleet_settings, scenario, timeout_s=30)

    assert elapsed_s < 5, elapsed_s
    assert [r.status for r in results] == [
        EventStatus.COMPLETED,
        EventStatus.FAILED,
        EventStatus.FAILED,
    ]
    for late in results[1:]:
        assert late.error is not None and "deadline_s=1" in late.error
    assert_one_linked_pair_per_call(branch, results)
    # The last call was never enqueued: no worker ever heard of it.
    assert results[2].call_id is not None
    assert AsyncResult(results[2].call_id, app=celery_app).state == "PENDING"
