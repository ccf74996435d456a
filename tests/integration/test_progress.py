"""Progress (docs/controls.md): ``current_call().progress()`` in sync and async tools reaches
``Branch.on_progress`` in order with the right call id, throttled to 10 a second per call with
the last report kept, for nothing when nobody listens; a failing callback is isolated; the
collector drops reports of calls it does not know. Real workers (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from typing import Any

import redis

from tests.support.fleet import WorkerProcess, call, make_call, run
from tests.support.waiting import until
from toolfleet import current_call
from toolfleet.dispatcher import Branch, CallbackFailed, CallProgress, Fleet
from toolfleet.dispatcher.send.enqueue import publish_calls
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.errors import NoCurrentCallError
from toolfleet.schemas.progress import ProgressReport, decode, encode, is_progress
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.workers.progress import INTERVAL_S
from toolfleet.workers.registry import registry


def _act(
    settings: Settings, request: dict[str, Any], **act: Any
) -> tuple[list[CallProgress], ActionResponseModel, Branch]:
    received: list[CallProgress] = []

    async def scenario(fleet: Fleet) -> tuple[ActionResponseModel, Branch]:
        branch = Branch(fleet=fleet)
        branch.on_progress(received.append)
        (result,) = await branch.act([request], **act)
        return result, branch

    result, branch = run(settings, scenario)
    return received, result, branch


def _check_in_order(received: list[CallProgress], result: ActionResponseModel, n: int) -> None:
    assert result.status is EventStatus.COMPLETED and result.output == n
    # progress(i, total=n) with ints reaches the listener as ints, as the tool said them.
    assert [repr(p.done) for p in received] == [repr(i) for i in range(1, n + 1)]
    assert {p.call_id for p in received} == {result.call_id}
    assert {repr(p.total) for p in received} == {repr(n)}
    assert received[-1].message == f"step {n} of {n}"


def test_a_sync_tools_reports_reach_the_branch_callback_in_order(
    fleet_settings: Settings, sync_worker: WorkerProcess
) -> None:
    # 0.15 s apart: more than the throttle's 0.1 s, so every report goes through.
    received, result, _ = _act(fleet_settings, call("count_sync", n=4, delay_s=0.15))
    _check_in_order(received, result, 4)
    assert {p.tool for p in received} == {"count_sync"}
    assert all(p.reported_at <= time.time() for p in received)


def test_an_async_tools_reports_reach_the_act_callback_in_order(
    fleet_settings: Settings, async_worker: WorkerProcess
) -> None:
    per_act: list[CallProgress] = []
    received, result, _ = _act(
        fleet_settings, call("count_async", n=4, delay_s=0.15), on_progress=per_act.append
    )
    _check_in_order(received, result, 4)
    assert per_act == received  # act(on_progress=...) beside the branch's own callback


def test_tools_of_a_bundle_report_progress_each_under_its_own_call(
    fleet_settings: Settings, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    received: list[CallProgress] = []

    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        branch = Branch(fleet=fleet)
        branch.on_progress(received.append)
        requests = [call("count_sync", n=2, delay_s=0.12), call("count_async", n=2, delay_s=0.12)]
        return await branch.act(requests * 2, call_params=CallParams(bundle_size=2))

    results = run(fleet_settings, scenario)
    assert [r.status for r in results] == [EventStatus.COMPLETED] * 4
    for result in results:
        mine = [p.done for p in received if p.call_id == result.call_id]
        assert mine == [1.0, 2.0], (result.function, mine)


def _throttled(
    received: list[CallProgress], result: ActionResponseModel, branch: Branch, n: int
) -> float:
    assert result.status is EventStatus.COMPLETED
    duration_s = branch.events[-1].duration_s or 0.0
    # One at once, then at most one per 0.1 s, then the last one when the call ends: over the
    # time the tool spent reporting (longer than 0.5 s on a loaded machine), not a fixed count.
    span_s = received[-1].reported_at - received[0].reported_at
    bound = math.floor(span_s / INTERVAL_S) + 2
    assert 2 <= len(received) <= bound, (len(received), span_s, duration_s)
    assert received[-1].done == n  # the last report is never dropped
    dones = [p.done for p in received]
    assert dones == sorted(set(dones))
    return span_s


def test_a_flood_of_reports_is_throttled_to_ten_a_second_with_the_last_kept(
    fleet_settings: Settings, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    # 1,000 reports in about 0.5 s: about 6 reach the callback.
    received, result, branch = _act(fleet_settings, call("count_sync", n=1000, delay_s=0.0005))
    if _throttled(received, result, branch, 1000) <= 0.6:
        assert len(received) <= 8
    received, result, branch = _act(fleet_settings, call("count_async", n=1000, delay_s=0.0005))
    _throttled(received, result, branch, 1000)


def test_reports_go_to_the_reply_list_before_the_result_and_only_when_asked(
    celery_app: Any, redis_client: redis.Redis, sync_worker: WorkerProcess
) -> None:
    """The wire: a call whose message asks for progress gets its reports on its reply list,
    ahead of its result; the same call not asking gets its result alone (no added push)."""
    for asked in (True, False):
        reply_to = f"toolfleet:reply:test-{uuid.uuid4().hex}"
        message = make_call("count_sync", {"n": 3, "delay_s": 0.12}, reply_to=reply_to)
        message = message.model_copy(update={"progress": asked})
        assert ("progress" in message.model_dump(mode="json")) is asked
        publish_calls(celery_app, [(message, registry.get("count_sync"))])
        *reports, result = _entries_to_the_result(redis_client, reply_to)
        assert json.loads(result)["call_id"] == message.call_id
        decoded = [decode(raw) for raw in reports]
        assert all(r is not None and r.call_id == message.call_id for r in decoded)
        assert [r.done for r in decoded if r is not None] == ([1.0, 2.0, 3.0] if asked else [])
        assert redis_client.lrange(reply_to, 0, -1) == []


def _entries_to_the_result(client: redis.Redis, reply_to: str) -> list[bytes]:
    """The raw entries of ``reply_to``, in list order, up to the call's result."""
    entries: list[bytes] = []

    def result_arrived() -> bool:
        item: Any = client.blpop([reply_to], timeout=0.2)
        if item is not None:
            entries.append(item[1])
        return bool(entries) and not is_progress(entries[-1])

    until(result_arrived, timeout_s=30, interval_s=0, what="the call's result")
    return entries


def test_a_failing_callback_is_isolated_and_recorded(
    fleet_settings: Settings, async_worker: WorkerProcess
) -> None:
    def broken(progress: CallProgress) -> None:
        raise ValueError(f"no room for {progress.done}")

    seen: list[float] = []

    async def scenario(fleet: Fleet) -> tuple[ActionResponseModel, Branch]:
        branch = Branch(fleet=fleet)
        branch.on_progress(broken)
        branch.on_progress(lambda p: seen.append(p.done))
        (result,) = await branch.act([call("count_async", n=2, delay_s=0.15)])
        return result, branch

    result, branch = run(fleet_settings, scenario)
    assert result.status is EventStatus.COMPLETED and seen == [1, 2]
    failures = [s for s in branch.signals if isinstance(s, CallbackFailed)]
    assert [f.where for f in failures] == ["on_progress", "on_progress"]
    assert failures[0].error == "ValueError: no room for 1"
    assert {f.call_id for f in failures} == {result.call_id}


def test_reports_of_calls_the_collector_does_not_know_are_dropped(
    fleet_settings: Settings, async_worker: WorkerProcess
) -> None:
    """What a restarted dispatcher's list may hold: reports of calls it never sent (or no
    longer awaits), and entries it cannot read; results still arrive."""

    async def scenario(fleet: Fleet) -> tuple[list[CallProgress], ActionResponseModel]:
        stranger = ProgressReport(
            call_id="not-mine", function="count_async", done=1, seq=1, at=time.time()
        )
        await fleet.redis.rpush(
            fleet.reply_key, encode(stranger), '{"progress": not json', '{"progress":{}}'
        )
        received: list[CallProgress] = []
        branch = Branch(fleet=fleet)
        branch.on_progress(received.append)
        (result,) = await branch.act([call("count_async", n=2, delay_s=0.15)])
        await asyncio.sleep(0.2)
        return received, result

    received, result = run(fleet_settings, scenario)
    assert result.status is EventStatus.COMPLETED
    assert [p.call_id for p in received] == [result.call_id] * 2


def test_current_call_outside_a_worker_says_so() -> None:
    try:
        current_call()
    except NoCurrentCallError as exc:
        assert "inside a tool run by a toolfleet worker" in str(exc)
    else:
        raise AssertionError("current_call() outside a worker returned")
