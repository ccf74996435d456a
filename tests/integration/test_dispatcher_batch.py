"""Branch.act batches end to end (ADR-0012 D4, C8): strategies, call_params, the collector."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from datetime import datetime
from typing import Any

import pytest

from tests.integration.test_dispatcher_act import assert_linked_history, finished_at
from tests.support.command_log import CommandLog
from tests.support.fleet import call, run, start_worker
from tests.support.overlap import most_at_once
from tests.support.waiting import until_async
from toolfleet.dispatcher import Branch, ConfigurationError, Fleet, HookPoint
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.errors import UnknownToolError
from toolfleet.schemas.messages import ActionRequest
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.usefixtures("sync_worker", "async_worker")


def started_at(event: EventRecord) -> float:
    return datetime.fromisoformat(str(event.created_at)).timestamp()


def max_overlap(events: list[EventRecord]) -> int:
    """The most executions running at one instant, from the events' start and duration."""
    return most_at_once((started_at(e) for e in events), (finished_at(e) for e in events))


def test_invalid_strategy_is_a_configuration_error_before_anything(
    fleet_settings: Settings,
) -> None:
    async def scenario(fleet: Fleet) -> Branch:
        branch = Branch(fleet=fleet)
        with pytest.raises(ConfigurationError, match="'parallel'"):
            await branch.act(call("echo", value=1), strategy="parallel")
        return branch

    branch = run(fleet_settings, scenario)
    assert branch.messages == [] and branch.events == []


def test_sequential_awaits_each_call_before_enqueuing_the_next(fleet_settings: Settings) -> None:
    requests = [call("sleep_async", seconds=0.4), call("echo", value=1), call("add", a=1, b=2)]

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        return branch, await branch.act(requests, strategy="sequential")

    branch, results = run(fleet_settings, scenario)
    assert [r.output for r in results] == [0.4, 1, 3]
    assert_linked_history(branch, results)
    events = branch.events
    assert started_at(events[1]) >= finished_at(events[0])
    assert started_at(events[2]) >= finished_at(events[1])


def test_sequential_stops_at_an_unsuppressed_failure(fleet_settings: Settings) -> None:
    async def scenario(fleet: Fleet) -> Branch:
        branch = Branch(fleet=fleet)
        with pytest.raises(UnknownToolError):
            await branch.act(
                [call("echo", value=1), call("nope"), call("echo", value=3)],
                strategy="sequential",
                suppress_errors=False,
            )
        return branch

    branch = run(fleet_settings, scenario)
    assert [m.function for m in branch.messages if isinstance(m, ActionRequest)] == ["echo", "nope"]


def test_in_flight_window_defaults_to_settings_and_follows_max_in_flight_c8(
    fleet_settings: Settings,
) -> None:
    narrow = fleet_settings.model_copy(update={"max_in_flight": 2})
    requests = [call("sleep_async", seconds=0.3) for _ in range(6)]

    async def scenario(fleet: Fleet, params: CallParams | None) -> Branch:
        branch = Branch(fleet=fleet)
        results = await branch.act(requests, call_params=params)
        assert [r.output for r in results] == [0.3] * 6
        return branch

    by_default = run(narrow, lambda f: scenario(f, None))
    assert max_overlap(by_default.events) <= 2
    wider = run(narrow, lambda f: scenario(f, CallParams(max_in_flight=6)))
    assert max_overlap(wider.events) >= 3  # the async pool runs them together
    one = run(fleet_settings, lambda f: scenario(f, CallParams(max_in_flight=1)))
    assert max_overlap(one.events) == 1


def test_retry_attempts_rerun_failed_attempts_and_record_each(fleet_settings: Settings) -> None:
    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        results = await branch.act(
            [call("fail_async", message="flaky"), call("echo", value=1), call("fail")],
            call_params=CallParams(retry_attempts=2),
        )
        return branch, results

    branch, results = run(fleet_settings, scenario)
    assert [r.status for r in results] == [
        EventStatus.FAILED,
        EventStatus.COMPLETED,
        EventStatus.FAILED,
    ]
    assert results[0].error == "ValueError: flaky"
    assert_linked_history(branch, results)  # one pair per call, whatever the attempts
    by_call = [(e.call_id, e.attempt, e.execution["status"]) for e in branch.events]
    first, echo, last = (r.call_id for r in results)
    assert by_call == [
        (first, 0, "failed"),
        (first, 1, "failed"),
        (first, 2, "failed"),
        (echo, 0, "completed"),
        (last, 0, "failed"),
        (last, 1, "failed"),
        (last, 2, "failed"),
    ]


def test_timeout_s_applies_per_call(fleet_settings: Settings) -> None:
    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        return await Branch(fleet=fleet).act(
            [call("sleep_async", seconds=10), call("sleep_async", seconds=0.05)],
            call_params=CallParams(timeout_s=0.5),
        )

    started = time.monotonic()
    results = run(fleet_settings, scenario)
    assert time.monotonic() - started < 8
    assert results[0].status is EventStatus.FAILED
    assert str(results[0].error).startswith("ToolTimeoutError:")
    assert results[1].output == 0.05


def test_throttle_period_spaces_call_starts(
    fleet_settings: Settings, redis_url: str, redis_db: int
) -> None:
    """The throttle spaces the dispatcher's starts of the calls: their messages reach the
    broker ``throttle_period_s`` apart (Redis's own clock, MONITOR). When the worker runs
    them is the worker's business: a busy worker may start two queued calls back to back."""

    async def scenario(fleet: Fleet) -> Branch:
        branch = Branch(fleet=fleet)
        await branch.act(
            [call("whoami_async") for _ in range(4)],
            call_params=CallParams(throttle_period_s=0.25),
        )
        return branch

    with CommandLog(redis_url, redis_db) as log:
        branch = run(fleet_settings, scenario)
    assert len(branch.events) == 4
    pushed = [
        t
        for command, t in zip(log.commands, log.times, strict=True)
        if command.startswith(f"LPUSH {fleet_settings.async_queue} ")
    ]
    gaps = [b - a for a, b in itertools.pairwise(pushed)]
    assert len(gaps) == 3 and min(gaps) > 0.15, gaps


def test_return_exceptions_keeps_raised_failures_in_their_slots(fleet_settings: Settings) -> None:
    async def scenario(fleet: Fleet) -> tuple[Branch, list[Any]]:
        branch = Branch(fleet=fleet)
        results = await branch.act(
            [call("echo", value=1), call("nope"), call("sleep_async", seconds=0.1)],
            suppress_errors=False,
            call_params=CallParams(return_exceptions=True),
        )
        return branch, results

    branch, results = run(fleet_settings, scenario)
    assert results[0].output == 1 and results[2].output == 0.1
    assert isinstance(results[1], UnknownToolError)
    assert len(branch.messages) == 6  # the batch went on; every call has its pair


def test_collector_keeps_the_loop_free_and_history_grows_in_input_order(
    fleet_settings: Settings,
) -> None:
    n = 1200
    requests = [
        call("sleep_async", seconds=0.001 * (i % 7)) if i % 2 else call("echo", value=i)
        for i in range(n)
    ]

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel], dict[str, Any]]:
        branch = Branch(fleet=fleet)
        posts: list[str] = []
        branch.hooks.on(HookPoint.TOOL_POST, lambda p: posts.append(p["call_id"]))
        seen: dict[str, Any] = {"ticks": 0, "max_gap_s": 0.0, "sizes": []}
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                seen["max_gap_s"] = max(seen["max_gap_s"], now - last)
                seen["ticks"] += 1
                last = now
                size = len(branch.messages)
                seen["sizes"].append(size)
                # While the batch runs, the written history is an input-order prefix.
                values = [m.arguments.get("value") for m in branch.messages[0:size:2][:50]]
                expected = [r["arguments"].get("value") for r in requests[: len(values)]]
                assert values == expected

        tick = asyncio.create_task(ticker())
        started = time.monotonic()
        results = await branch.act(requests)
        seen["elapsed_s"] = time.monotonic() - started
        done.set()
        await tick
        assert posts == [r.call_id for r in results]
        return branch, results, seen

    branch, results, seen = run(fleet_settings, scenario, timeout_s=240)
    assert len(results) == n
    assert [r.output for r in results[::2]] == list(range(0, n, 2))
    assert all(r.success for r in results)
    assert_linked_history(branch, results)
    assert [e.call_id for e in branch.events] == [r.call_id for r in results]
    # The loop kept ticking: no blocking wait on the collector or the broker. Quiet, it ticks
    # every 12 ms (270 ticks in 3.3 s, the longest gap 0.13 s), but the batch's own work
    # shares the loop and CPU starvation looks the same as a blocking wait from here: with
    # four test processes on two cores it ticked every 50-90 ms. So the average asked is one
    # tick per 200 ms; together with the longest gap (< 1 s) that still fails a loop that
    # blocks on the broker chunk by chunk.
    assert seen["ticks"] >= seen["elapsed_s"] / 0.01 / 20
    # A blocking wait would stall it for seconds; a loaded 2-core machine alone can withhold
    # the CPU from the loop for a few hundred ms (0.52 s seen with the suite under nice).
    assert seen["max_gap_s"] < 1.0, seen["max_gap_s"]
    # History grew while the batch ran, not all at the end.
    assert any(0 < size < 2 * n for size in seen["sizes"])


def test_cancelling_act_during_a_write_still_writes_whole_units_in_order(
    fleet_settings: Settings,
) -> None:
    async def scenario(fleet: Fleet) -> Branch:
        branch = Branch(fleet=fleet)
        in_hook = asyncio.Event()
        release = asyncio.Event()

        async def slow_post(payload: dict[str, Any]) -> None:
            if payload["response"] == "first":
                in_hook.set()
                await release.wait()  # the write of call 0 is in progress here

        branch.hooks.on(HookPoint.TOOL_POST, slow_post)
        task = asyncio.create_task(
            branch.act([call("echo", value="first"), call("sleep_async", seconds=5)])
        )
        await in_hook.wait()
        task.cancel()
        await asyncio.sleep(0)  # let the cancellation reach the batch before releasing
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return branch

    branch = run(fleet_settings, scenario)
    roles = [m.role for m in branch.messages]
    assert roles == ["action_request", "action_response"] * 2
    first, second = branch.messages[1], branch.messages[3]
    assert first.content.output == "first" and first.content.error is None  # type: ignore[union-attr]
    assert str(second.content.error).startswith("CancelledError")  # type: ignore[union-attr]
    assert [e.execution["status"] for e in branch.events] == ["completed", "cancelled"]


def test_batch_size_sends_several_calls_per_message_each_with_its_own_response(
    fleet_settings: Settings, redis_url: str
) -> None:
    """CallParams.bundle_size (opt-in): 25 sync calls become 3 Celery messages on the queue,
    and each call still gets its own record and linked response, failures included."""
    queue = f"toolfleet.test-batched-{uuid.uuid4().hex[:8]}"
    settings = fleet_settings.model_copy(update={"sync_queue": queue})
    requests = [call("echo", value=i) for i in range(24)] + [call("fail", message="nope")]

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        act = asyncio.ensure_future(
            branch.act(requests, call_params=CallParams(bundle_size=10, max_in_flight=100))
        )
        # No worker serves this queue yet: the messages wait there to be counted.
        client = fleet.redis

        async def all_queued() -> bool:
            return await client.llen(queue) >= 3

        await until_async(
            all_queued, timeout_s=20, interval_s=0.02, what="the batched messages to be queued"
        )
        queued = [json.loads(raw) for raw in await client.lrange(queue, 0, -1)]
        assert [m["headers"]["task"] for m in queued] == ["toolfleet.execute_many"] * 3
        worker = await asyncio.to_thread(
            start_worker,
            "sync",
            redis_url=redis_url,
            concurrency=2,
            env={"TOOLFLEET_SYNC_QUEUE": queue},
        )
        try:
            return branch, await act
        finally:
            await asyncio.to_thread(worker.stop)

    branch, results = run(settings, scenario, timeout_s=90)
    assert [r.output for r in results[:24]] == list(range(24))
    assert all(r.status is EventStatus.COMPLETED for r in results[:24])
    assert results[24].status is EventStatus.FAILED and results[24].error == "ValueError: nope"
    assert len(branch.events) == 25
    assert_linked_history(branch, results)
