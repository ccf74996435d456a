"""Cancellation across machines (C9).

Cancelling the task that awaits ``act()``: queued calls are revoked and never run, running async
calls are cancelled on their worker, every unfinished call is recorded CANCELLED (Celery and
Flower show REVOKED), CancelledError reaches the caller, and finished calls keep their results.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from tests.support.agent_fleet import cancel_when
from tests.support.fleet import WorkerProcess, call
from tests.support.waiting import until, until_async
from toolfleet.dispatcher import Branch, Fleet, HookPoint
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.messages import ActionRequest, ActionResponse
from toolfleet.schemas.settings import Settings


@pytest.mark.usefixtures("async_worker")
def test_cancelling_act_revokes_queued_cancels_running_and_records_every_call(
    lone_sync: tuple[Settings, WorkerProcess],
    celery_app: Celery,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    settings, _worker = lone_sync
    keys = Keys(settings.key_prefix)
    never_written = tmp_path / "queued.txt"
    requests = [
        call("echo", value="done"),  # finishes before the cancel: keeps its result
        call("sleep_async", seconds=30),  # running on the async worker: cancelled there
        call("sleep_sync", seconds=1.5),  # running in the only sync slot: left to finish
        call("append_line", path=str(never_written), text="x"),  # queued: revoked
        call("add", a=1, b=2),  # queued once echo frees a window slot: revoked
        call("add", a=3, b=4),  # waiting for the window: never enqueued
    ]
    functions = [r["function"] for r in requests]
    pre_ids: dict[str, list[str]] = {}

    async def scenario() -> tuple[Branch, float]:
        fleet = Fleet(settings)
        try:
            branch = Branch(fleet=fleet)
            branch.hooks.on(
                HookPoint.TOOL_PRE,
                lambda p: pre_ids.setdefault(p["tool_name"], []).append(p["call_id"]),
            )
            task = asyncio.ensure_future(
                branch.act(requests, call_params=CallParams(max_in_flight=4))
            )

            def settled() -> bool:
                started = [
                    redis_client.exists(keys.started(i))
                    for name in ("sleep_async", "sleep_sync")
                    for i in pre_ids.get(name, [])
                ]
                return (
                    len(branch.messages) == 2
                    and len(started) == 2
                    and all(started)
                    and redis_client.llen(settings.sync_queue) == 2
                )

            cancelled_at = await cancel_when(
                task, settled, what="the batch to reach the cancel point"
            )
            return branch, time.monotonic() - cancelled_at
        finally:
            await fleet.aclose()

    branch, cancel_s = asyncio.run(asyncio.wait_for(scenario(), 40))

    assert cancel_s < 5, cancel_s
    # Every call has its linked pair, in input order; only the finished one succeeded.
    messages = branch.messages
    assert len(messages) == 2 * len(requests)
    for i, function in enumerate(functions):
        request, response = messages[2 * i], messages[2 * i + 1]
        assert isinstance(request, ActionRequest) and isinstance(response, ActionResponse)
        assert request.content.function == function
        assert request.content.action_response_id == response.id
        assert response.content.action_request_id == request.id
    first = messages[1]
    assert isinstance(first, ActionResponse)
    assert first.success and first.content.output == "done"
    for response in messages[3::2]:
        assert isinstance(response, ActionResponse)
        assert not response.success
        assert response.content.error is not None
        assert response.content.error.startswith("CancelledError: ")
    assert [e.execution["status"] for e in branch.events] == ["completed"] + ["cancelled"] * 5
    # The same, durably: another process can load it from Redis.
    assert redis_client.llen(keys.history(branch.id)) == 2 * len(requests)
    assert redis_client.llen(keys.events(branch.id)) == len(requests)

    (running_async,) = pre_ids["sleep_async"]
    (running_sync,) = pre_ids["sleep_sync"]
    (queued_append,) = pre_ids["append_line"]
    assert len(pre_ids["add"]) == 1, "the call waiting for the window must never start"
    (queued_add,) = pre_ids["add"]

    def state(task_id: str) -> str:
        return str(AsyncResult(task_id, app=celery_app).state)

    # The running async call is cancelled on its worker, long before its 30 s.
    until(lambda: state(running_async) == "REVOKED", timeout_s=5, what="async call revoked")
    # The queued calls reach the worker after the 1.5 s sync call and are dropped unrun.
    for queued in (queued_append, queued_add):
        until(lambda q=queued: state(q) == "REVOKED", timeout_s=15, what=f"{queued} revoked")
    assert not never_written.exists()
    # The sync call ran to its end, but its CANCELLED record stands (first record wins), so
    # the store, Celery and the history agree.
    until(lambda: state(running_sync) == "REVOKED", timeout_s=10, what="sync call settled")
    for call_id in (running_async, running_sync, queued_append, queued_add):
        stored = redis_client.get(keys.event(call_id))
        assert stored is not None and b'"cancelled"' in stored, call_id
        assert not redis_client.exists(keys.started(call_id)), call_id


@pytest.mark.usefixtures("sync_worker", "async_worker")
def test_cancelling_a_sequential_batch_records_the_running_and_the_unstarted_calls(
    fleet_settings: Settings, celery_app: Celery
) -> None:
    requests = [
        call("echo", value="done"),
        call("sleep_async", seconds=30),
        call("echo", value="never sent"),
    ]

    async def scenario() -> Branch:
        async with Fleet(fleet_settings) as fleet:
            branch = Branch(fleet=fleet)
            task = asyncio.ensure_future(branch.act(requests, strategy="sequential"))
            keys = Keys(fleet_settings.key_prefix)
            running: list[str] = []
            branch.hooks.on(
                HookPoint.TOOL_PRE,
                lambda p: running.append(p["call_id"]) if p["tool_name"] == "sleep_async" else None,
            )
            await until_async(
                lambda: running and fleet.redis.exists(keys.started(running[0])),
                timeout_s=15,
                interval_s=0.02,
                what="the async call to start",
            )
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return branch

    branch = asyncio.run(asyncio.wait_for(scenario(), 30))

    assert [e.execution["status"] for e in branch.events] == [
        "completed",
        "cancelled",
        "cancelled",
    ]
    responses = branch.messages[1::2]
    assert [isinstance(r, ActionResponse) and r.success for r in responses] == [True, False, False]
    cancelled_id = branch.events[1].call_id
    until(
        lambda: AsyncResult(cancelled_id, app=celery_app).state == "REVOKED",
        timeout_s=5,
        what="the running async call to be cancelled on its worker",
    )
    # The third call never reached the broker.
    assert AsyncResult(branch.events[2].call_id, app=celery_app).state == "PENDING"


class Abort(BaseException):
    """A cancellation-class exception (outside Exception) raised by a caller's hook."""


@pytest.mark.usefixtures("sync_worker", "async_worker")
def test_a_cancellation_class_exception_from_a_hook_stops_and_records_the_siblings(
    fleet_settings: Settings, celery_app: Celery
) -> None:
    requests = [call("sleep_async", seconds=30), call("add", a=1, b=2)]

    async def scenario() -> Branch:
        async with Fleet(fleet_settings) as fleet:
            branch = Branch(fleet=fleet)
            running: list[str] = []

            async def pre(payload: dict[str, Any]) -> None:
                if payload["tool_name"] == "sleep_async":
                    running.append(payload["call_id"])
                    return
                # Let the first call reach its worker, then abort the whole batch.
                keys = Keys(fleet_settings.key_prefix)
                await until_async(
                    lambda: running and fleet.redis.exists(keys.started(running[0])),
                    timeout_s=15,
                    interval_s=0.02,
                    what="the async call to start",
                )
                raise Abort("stop everything")

            branch.hooks.on(HookPoint.TOOL_PRE, pre)
            with pytest.raises(Abort):
                await branch.act(requests, call_params=CallParams(max_in_flight=2))
            return branch

    branch = asyncio.run(asyncio.wait_for(scenario(), 30))

    assert [e.execution["status"] for e in branch.events] == ["cancelled", "cancelled"]
    assert len(branch.messages) == 4
    running_id = branch.events[0].call_id
    until(
        lambda: AsyncResult(running_id, app=celery_app).state == "REVOKED",
        timeout_s=5,
        what="the sibling running on the async worker to be cancelled",
    )
