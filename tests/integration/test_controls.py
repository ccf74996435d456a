"""Fleet-wide rate limits and concurrency caps, and the effect key, with real workers.

The limited tools (tests/support/limit_tools.py) write their own side channel, a file of
start and end times: the tests measure what really ran and when, not what Redis says. One
prefork worker and one asyncio worker serve this module's queues, under a key prefix of its
own, so no bucket or slot of another run counts here.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.fleet import act_on, call, collect_replies, private_workers, run
from tests.support.overlap import most_at_once as peak_of
from tests.support.waiting import until, until_async
from toolfleet import NoCurrentCallError, RateLimitedError, current_call, rebuild_error
from toolfleet.broker.liveness import StartedMarker
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.accept.context import call_id_for
from toolfleet.dispatcher.infra.kombu_internals import (
    read_queued_and_reserved,
    split_queued_and_reserved,
)
from toolfleet.dispatcher.send.enqueue import publish_calls
from toolfleet.dispatcher.watch.whereabouts import call_ids_of
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallMessage
from toolfleet.workers.limit_scripts import SLOT_ACQUIRE_SCRIPT, TOKEN_BUCKET_SCRIPT

TOOLS = ("tests.support.limit_tools",)
Start = tuple[str, int, float, str]  # phase, token, epoch seconds, scope


@pytest.fixture(scope="module")
def controls(redis_url: str) -> Iterator[Settings]:
    """Settings of a sync and an async worker serving this module's queues and key prefix."""
    with private_workers(redis_url, "controls", tools=TOOLS) as env:
        yield Settings.from_env(env, tools=TOOLS)


def side_lines(side: Path) -> list[Start]:
    lines = []
    for line in side.read_text().splitlines():
        phase, token, at, _pid, _host, scope = line.split()
        lines.append((phase, int(token), float(at), scope))
    return lines


def assert_rate_held(starts: list[float], sent_at: float, per_second: float, burst: float) -> None:
    """The calls started by time t (from when the burst was sent, the bucket's earliest
    start) never exceed burst + rate·t·1.1."""
    for k, at in enumerate(sorted(starts), 1):
        allowed = burst + per_second * (at - sent_at) * 1.1
        assert k <= allowed, f"{k} calls started {at - sent_at:.3f}s in; at most {allowed:.2f}"


def most_at_once(lines: list[Start]) -> int:
    """The most runs between their S and E at one time, as the side channel saw them."""
    return peak_of(
        (at for phase, _, at, _ in lines if phase == "S"),
        (at for phase, _, at, _ in lines if phase != "S"),
    )


def completed(results: list[ActionResponseModel]) -> None:
    bad = [r.error for r in results if r.status is not EventStatus.COMPLETED]
    assert bad == [], bad


@pytest.mark.parametrize(
    ("function", "per_second", "calls"), [("rated_async", 20.0, 60), ("rated_sync", 10.0, 20)]
)
def test_a_rate_limit_holds_under_a_burst_and_per_tenant(
    controls: Settings, tmp_path: Path, function: str, per_second: float, calls: int
) -> None:
    side = tmp_path / "side"
    # A burst for one tenant, and a second tenant's calls among it.
    requests = [
        call(function, side=str(side), token=i, tenant="acme" if i % 3 else "globex")
        for i in range(calls)
    ]
    sent_at = time.time()  # the side channel's clock
    results = act_on(controls, requests)
    completed(results)
    lines = side_lines(side)
    assert len(lines) == calls
    by_tenant = {t: [at for _, _, at, scope in lines if scope == t] for t in ("acme", "globex")}
    for starts in by_tenant.values():
        assert_rate_held(starts, sent_at, per_second, burst=per_second)
    # The limit did hold acme back: its calls past the burst needed (n - burst) / rate.
    acme = by_tenant["acme"]
    assert max(acme) - sent_at >= (len(acme) - per_second) / per_second * 0.9


@pytest.mark.parametrize(
    ("function", "bundle_size"),
    [("capped_async", None), ("capped_sync", None), ("capped_async", 3)],
)
def test_a_concurrency_cap_holds_and_no_slot_is_left(
    controls: Settings,
    redis_client: redis.Redis,
    tmp_path: Path,
    function: str,
    bundle_size: int | None,
) -> None:
    side = tmp_path / "side"
    requests = [call(function, side=str(side), token=i, seconds=0.25) for i in range(6)]
    results = act_on(controls, requests, CallParams(bundle_size=bundle_size))
    completed(results)
    lines = side_lines(side)
    assert len(lines) == 12
    assert most_at_once(lines) == 2  # the cap, reached and never passed
    slots = Keys(controls.key_prefix).slots(function, "*")
    assert redis_client.zcard(slots) == 0


def test_the_wait_for_a_limit_does_not_eat_a_sync_tools_timeout(
    controls: Settings, tmp_path: Path
) -> None:
    side = tmp_path / "side"
    # One at a time, 1 s each to run: the last of three waits 1.2 s for its slot, and runs.
    requests = [call("capped_with_timeout", side=str(side), token=i, seconds=0.6) for i in range(3)]
    completed(act_on(controls, requests))
    starts = [at for phase, _, at, _ in side_lines(side) if phase == "S"]
    assert max(starts) - min(starts) > 1.0
    # The tool's own timeout_s still holds, from its start.
    (late,) = act_on(controls, [call("capped_with_timeout", side=str(side), token=3, seconds=5)])
    assert late.status is EventStatus.FAILED
    assert (late.error or "").startswith("ToolTimeoutError: "), late.error


def held_by_a_worker(settings: Settings, client: redis.Redis, call_id: str) -> bool:
    """Whether ``call_id``'s message is still queued or reserved (kombu's unacked hash): a
    worker acks a call's message only once it is done with it (task_acks_late)."""
    queues = [settings.sync_queue, settings.async_queue]
    with client.pipeline(transaction=True) as pipe:
        read_queued_and_reserved(pipe, queues)
        waiting, reserved = split_queued_and_reserved(pipe.execute(), queues)
    messages = [*reserved, *(m for queued in waiting.values() for m in queued)]
    return any(call_id in call_ids_of(raw) for raw in messages)


def test_a_call_stopped_while_it_waits_for_a_slot_never_runs(
    controls: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    side = tmp_path / "side"
    busy = [call("capped_sync", side=str(side), token=i, seconds=1.5) for i in range(2)]
    late = [call("capped_sync", side=str(side), token=2, seconds=0.1)]
    slots = Keys(controls.key_prefix).slots("capped_sync", "*")

    async def scenario(fleet: Fleet) -> list[list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        first = asyncio.ensure_future(branch.act(busy))
        await until_async(
            lambda: redis_client.zcard(slots) == 2,
            timeout_s=20,
            what="both capped_sync slots to be taken",
            while_running=first,
        )
        # Its timeout_s passes while it waits: the dispatcher records it FAILED and revokes it.
        stopped = await Branch(fleet=fleet).act(late, call_params=CallParams(timeout_s=0.3))
        return [await first, stopped]

    ran, (stopped,) = run(controls, scenario)
    completed(ran)
    assert stopped.status is EventStatus.FAILED
    assert (stopped.error or "").startswith("ToolTimeoutError: "), stopped.error
    # Its message leaves Redis once a worker is done with it (after the slot it waited for),
    # seen so at two looks, not in the instant kombu moves a message from queue to unacked.
    looks: list[bool] = []

    def let_go() -> bool:
        looks.append(not held_by_a_worker(controls, redis_client, stopped.call_id or ""))
        return looks[-2:] == [True, True]

    until(let_go, timeout_s=30, interval_s=0.1, what="the worker to let go of the stopped call")
    assert {token for _, token, _, _ in side_lines(side)} == {0, 1}  # the late call never ran


def test_limit_key_gives_each_tenant_its_own_slots(controls: Settings, tmp_path: Path) -> None:
    side = tmp_path / "side"
    tenants = ("acme", "globex", "initech")
    requests = [
        call("per_tenant_async", side=str(side), token=i, tenant=tenants[i % 3], seconds=0.3)
        for i in range(9)
    ]
    started = time.monotonic()
    completed(act_on(controls, requests))
    elapsed_s = time.monotonic() - started
    lines = side_lines(side)
    for tenant in tenants:
        assert most_at_once([line for line in lines if line[3] == tenant]) == 1
    assert most_at_once(lines) == 3  # one per tenant, side by side
    assert elapsed_s < 9 * 0.3  # not one at a time


def test_a_call_past_its_limit_wait_fails_rate_limited_with_retry_after(
    controls: Settings, tmp_path: Path
) -> None:
    tenant, other = f"acme-{uuid.uuid4().hex[:6]}", f"globex-{uuid.uuid4().hex[:6]}"
    requests = [call("rated_slowly", tenant=tenant) for _ in range(3)]
    started = time.monotonic()
    results = act_on(
        controls, [*requests, call("rated_slowly", tenant=other)], CallParams(limit_wait_s=0.5)
    )
    assert time.monotonic() - started < 10
    # One call an hour per tenant: the other tenant's call has a bucket of its own.
    assert results.pop().status is EventStatus.COMPLETED
    assert sorted(r.status.value for r in results) == ["completed", "failed", "failed"]
    for result in results:
        if result.status is EventStatus.COMPLETED:
            continue
        error = result.error or ""
        assert error.startswith(
            f"RateLimitedError: call of tool 'rated_slowly' not run: rate limit 1/h for "
            f"tenant '{tenant}' reached"
        ), error
        # The model reads the same sentence, and the error rebuilt from the result's
        # structure knows when to retry.
        assert result.to_openai()["content"] == error
        assert result.error_info is not None
        rebuilt = rebuild_error(result.error_info)
        assert isinstance(rebuilt, RateLimitedError), rebuilt
        retry_after_s = rebuilt.retry_after_s
        assert retry_after_s is not None and 3500 < retry_after_s <= 3600, error

    # A concurrency cap: a third call finds both slots taken for longer than it may wait.
    side = tmp_path / "side"
    capped = [call("capped_async", side=str(side), token=i, seconds=1.5) for i in range(3)]
    results = act_on(controls, capped, CallParams(limit_wait_s=0.3))
    statuses = sorted(r.status.value for r in results)
    assert statuses == ["completed", "completed", "failed"], [r.error for r in results]
    (failed,) = [r for r in results if r.status is EventStatus.FAILED]
    assert failed.error == (
        "RateLimitedError: call of tool 'capped_async' not run: concurrency cap 2 reached "
        "(2 calls running; waited 0.3 s, the call's limit_wait_s); retry after 1 s"
    )
    assert len(side_lines(side)) == 4  # the refused call never ran


def test_a_tool_without_limits_adds_no_redis_command(
    controls: Settings, redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """MONITOR the call of a tool without limits and of one with: only the second runs the
    limit scripts or touches a bucket or slot key."""
    import hashlib

    shas = {
        hashlib.sha1(s.encode()).hexdigest() for s in (TOKEN_BUCKET_SCRIPT, SLOT_ACQUIRE_SCRIPT)
    }
    prefix = controls.key_prefix
    db = redis_client.connection_pool.connection_kwargs["db"]

    def commands_of(requests: list[dict[str, Any]]) -> list[str]:
        seen: list[str] = []
        monitor_client = redis.Redis.from_url(redis_url)
        with monitor_client.monitor() as monitor:
            results = act_on(controls, requests)
            completed(results)
            redis_client.set(f"{prefix}:monitor-end", "1")
            for command in monitor.listen():
                if command["db"] != db:
                    continue
                if f"{prefix}:monitor-end" in command["command"]:
                    break
                seen.append(command["command"])
        monitor_client.close()
        return seen

    def limits_touched(commands: list[str]) -> list[str]:
        return [
            c
            for c in commands
            if f"{prefix}:rate:" in c or f"{prefix}:slots:" in c or any(s in c for s in shas)
        ]

    path = tmp_path / "keys"
    plain = commands_of([call("effect_key_async", path=str(path))])
    assert plain, "MONITOR saw nothing"
    assert limits_touched(plain) == []
    side = tmp_path / "side"
    limited = commands_of([call("capped_async", side=str(side), token=0, seconds=0.0)])
    assert limits_touched(limited) != []


# --- the effect key ---


def openai_call(tool_call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": tool_call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def keys_in(path: Path) -> list[str]:
    return [line.split()[0] for line in path.read_text().splitlines()]


def test_the_effect_key_is_one_per_call_on_sync_and_async_tools(
    controls: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    sync_path, async_path = tmp_path / "sync", tmp_path / "async"
    turn = [
        openai_call("call_s", "effect_key_sync", path=str(sync_path)),
        openai_call("call_a", "effect_key_async", path=str(async_path)),
    ]

    async def scenario(fleet: Fleet) -> tuple[str, list[list[ActionResponseModel]]]:
        branch = Branch(fleet=fleet)
        first = await branch.act(turn)
        replayed = await branch.act(turn)  # the model's replay: answered from the records
        # The records expire (record_ttl_s): a replay after that runs the tools again.
        for result in first:
            await fleet.redis.delete(Keys(controls.key_prefix).event(result.call_id or ""))
        rerun = await branch.act(turn)
        other = await Branch(fleet=fleet).act(turn)  # same tool_call_ids, another branch
        return branch.id, [first, replayed, rerun, other]

    branch_id, (first, replayed, rerun, other) = run(controls, scenario)
    for results in (first, replayed, rerun, other):
        completed(results)
    expected = [call_id_for(branch_id, "call_s"), call_id_for(branch_id, "call_a")]
    assert [r.output for r in first] == [r.call_id for r in first] == expected
    assert [r.output for r in replayed] == [r.output for r in rerun] == expected
    # Each tool ran twice (first, and after its record expired), under the same key.
    assert keys_in(sync_path) == [expected[0]] * 2 + [other[0].output]
    assert keys_in(async_path) == [expected[1]] * 2 + [other[1].output]
    assert len({*expected, other[0].output, other[1].output}) == 4  # another call, another key


def test_a_retried_attempt_keeps_the_effect_key(controls: Settings, tmp_path: Path) -> None:
    path = tmp_path / "flaky"
    (retried,) = act_on(
        controls, [call("effect_key_flaky", path=str(path))], CallParams(retry_attempts=1)
    )
    assert retried.status is EventStatus.COMPLETED
    assert keys_in(path) == [retried.call_id, retried.call_id]  # failed, then retried


def _lost_run(controls: Settings, client: redis.Redis, function: str, **arguments: Any) -> Any:
    """Publish a call as its redelivery finds it after its worker died mid-run: a stale
    started marker (and, for a capped tool, the dead run's slot); its record, once written."""
    keys = Keys(controls.key_prefix)
    reply_to = keys.reply(f"test-lost-{uuid.uuid4().hex}")
    message = CallMessage(
        call_id=str(uuid.uuid4()), function=function, arguments=arguments, reply_to=reply_to
    )
    dead = StartedMarker(worker="ghost@nowhere", pid=1, attempt=0, beat_at=time.time() - 3600)
    client.set(keys.started(message.call_id), dead.to_json())
    slots = keys.slots(function, "*")
    client.zadd(slots, {message.call_id: time.time() + 3600})
    fleet = Fleet(controls)
    try:
        publish_calls(fleet.app, [(message, fleet.tool(function))])
    finally:
        fleet.app.close()
    (result,) = collect_replies(client, reply_to, 1, timeout_s=15)
    return message, result, client.zscore(slots, message.call_id)


def test_a_read_only_tool_runs_again_when_its_worker_was_lost_under_the_same_key(
    controls: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "keys"
    message, result, _ = _lost_run(
        controls, redis_client, "read_only_key", path=str(path), seconds=0
    )
    assert result.status is EventStatus.COMPLETED
    assert keys_in(path) == [message.call_id] and result.execution["response"] == message.call_id
    # A capped tool that is not idempotent: FAILED WorkerLostError, the dead run's slot back.
    side = tmp_path / "side"
    _, lost, slot = _lost_run(
        controls, redis_client, "capped_sync", side=str(side), token=0, seconds=0
    )
    assert (
        lost.status is EventStatus.FAILED and lost.execution["error"]["error"] == "WorkerLostError"
    )
    assert "nor read_only=True" in lost.execution["error"]["message"]
    assert slot is None and not side.exists()


def test_current_call_outside_a_tool_is_a_clear_error() -> None:
    with pytest.raises(NoCurrentCallError, match="only available inside a tool"):
        current_call()
