"""Pure-logic tests of the dispatcher's parts: envelopes, hooks, policy, wire checks, gates."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel

from tests.support.waiting import until_async
from toolfleet.dispatcher.accept.context import CallContext
from toolfleet.dispatcher.accept.envelope import normalize
from toolfleet.dispatcher.batch.act import check_wire
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.hooks import HookBus, HookPoint, StopHook
from toolfleet.dispatcher.govern.permissions import PermissionPolicy
from toolfleet.dispatcher.session import Session
from toolfleet.dispatcher.watch.collector import Collector, connect
from toolfleet.schemas.action import ToolInvocation
from toolfleet.schemas.errors import (
    ConfigurationError,
    MalformedRequestError,
    NotJSONError,
    OversizedArgumentsError,
)
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.messages import ActionRequest, ActionRequestContent
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallResult


class Proposal(BaseModel):
    function: str
    arguments: dict[str, Any]


class NotAProposal(BaseModel):
    function: str


def test_normalize_accepts_the_three_envelopes() -> None:
    request = ActionRequest(content=ActionRequestContent(function="add", arguments={"a": 1}))
    assert normalize(request).function == "add"
    assert normalize(request).arguments == {"a": 1}
    assert normalize(Proposal(function="echo", arguments={"value": 2})).arguments == {"value": 2}
    envelope = normalize({"function": "echo", "arguments": "raw text"})
    assert (envelope.function, envelope.arguments) == ("echo", "raw text")


@pytest.mark.parametrize(
    "bad",
    [
        {"function": "echo"},
        {"arguments": {}},
        NotAProposal(function="echo"),
        "echo",
        42,
        None,
        {"function": "", "arguments": {}},
        {"function": 7, "arguments": {}},
    ],
)
def test_normalize_rejects_other_shapes_with_a_value_error(bad: Any) -> None:
    with pytest.raises(ValueError) as info:
        normalize(bad)
    assert isinstance(info.value, MalformedRequestError)
    assert "function" in str(info.value)


def test_pre_hooks_run_in_order_and_stop_hook_ends_the_chain() -> None:
    bus = HookBus()
    seen: list[str] = []

    def first(payload: dict[str, Any]) -> None:
        seen.append("first:" + payload["tool_name"])

    async def second(payload: dict[str, Any]) -> None:
        seen.append("second")
        raise StopHook

    bus.on(HookPoint.TOOL_PRE, first)
    bus.on("tool_pre", second)
    bus.on(HookPoint.TOOL_PRE, lambda p: seen.append("third"))
    asyncio.run(bus.emit_pre({"tool_name": "echo"}))
    assert seen == ["first:echo", "second"]


def test_pre_hook_exception_propagates_but_post_hook_exception_is_isolated() -> None:
    bus = HookBus()
    seen: list[str] = []

    def boom(payload: dict[str, Any]) -> None:
        raise RuntimeError("guard says no")

    bus.on(HookPoint.TOOL_PRE, boom)
    with pytest.raises(RuntimeError, match="guard says no"):
        asyncio.run(bus.emit_pre({}))

    bus.on(HookPoint.TOOL_POST, boom)
    bus.on(HookPoint.TOOL_POST, lambda p: seen.append(p["call_id"]))
    failures = asyncio.run(bus.emit(HookPoint.TOOL_POST, {"call_id": "c1"}))
    assert seen == ["c1"]
    assert [(f.point, type(f.error)) for f in failures] == [(HookPoint.TOOL_POST, RuntimeError)]


def test_unknown_hook_point_is_named() -> None:
    with pytest.raises(ValueError, match="tool_middle"):
        HookBus().on("tool_middle", lambda p: None)


def test_permission_policy_precedence_and_modes() -> None:
    policy = PermissionPolicy(
        allow={"shell": ["ls*"]},
        deny={"shell": ["rm *"], "*": ["drop*"]},
        escalate={"shell": ["sudo *"]},
    )
    assert policy.check("shell", "ls -l", {}).allowed
    assert policy.check("shell", "rm -rf /", {}).decision == "deny"
    assert policy.check("db", "drop table", {}).decision == "deny"
    assert policy.check("shell", "sudo reboot", {}).decision == "escalate"
    assert policy.check("shell", "cat x", {}).allowed  # allow_all default
    strict = PermissionPolicy(mode="deny_all", allow={"shell": ["ls*"]})
    assert strict.check("shell", "ls", {}).allowed
    assert strict.check("shell", "cat x", {}).decision == "deny"
    with pytest.raises(ConfigurationError, match="allow_some"):
        PermissionPolicy(mode="allow_some")


def test_escalation_is_resolved_by_on_escalate_sync_or_async() -> None:
    asked: list[tuple[str, str]] = []

    async def approve_reboot(tool: str, action: str, args: dict[str, Any]) -> bool:
        asked.append((tool, action))
        return action == "sudo reboot"

    policy = PermissionPolicy(escalate={"shell": ["sudo *"]}, on_escalate=approve_reboot)
    assert asyncio.run(policy.authorize("shell", {"action": "sudo reboot"})).allowed
    assert not asyncio.run(policy.authorize("shell", {"action": "sudo rm"})).allowed
    assert asked == [("shell", "sudo reboot"), ("shell", "sudo rm")]
    unattended = PermissionPolicy(escalate={"shell": ["*"]})
    assert not asyncio.run(unattended.authorize("shell", {"action": "x"})).allowed


def test_permission_preprocessor_raises_permission_error() -> None:
    policy = PermissionPolicy(deny={"shell": ["rm *"]})
    pre = policy.to_pre_hook("shell")
    assert pre({"action": "ls"}) == {"action": "ls"}
    with pytest.raises(PermissionError, match="rm -rf"):
        pre({"action": "rm -rf /"})


def _echo(value: Any = None) -> Any:
    return value


def test_check_wire_names_the_non_json_key_and_the_size_limit() -> None:
    tool = Tool(func_callable=_echo)
    ctx = CallContext("echo", {"ok": 1, "value": {1, 2}}, tool=tool)
    with pytest.raises(NotJSONError, match="'value'"):
        check_wire(ctx, 1_000)
    with pytest.raises(NotJSONError, match="'value'"):
        check_wire(CallContext("echo", {"value": float("nan")}, tool=tool), 1_000)
    with pytest.raises(OversizedArgumentsError, match="over the 100-byte limit"):
        check_wire(CallContext("echo", {"value": "x" * 200}, tool=tool), 100)
    check_wire(CallContext("echo", {"value": "x" * 50}, tool=tool), 100)


def test_session_gate_denies_on_falsy_or_raising_and_allows_async_true() -> None:
    session = Session()
    invocation = ToolInvocation("echo", {"value": 1}, "b1")
    assert asyncio.run(session.authorize(invocation)) is None  # no gate allows

    async def allow(inv: ToolInvocation) -> bool:
        return True

    session.gate(allow)
    assert asyncio.run(session.authorize(invocation)) is None
    session.gate(lambda inv: inv.arguments.get("value") == 2)
    assert "returned False" in str(asyncio.run(session.authorize(invocation)))

    def broken(inv: ToolInvocation) -> bool:
        raise KeyError("policy table")

    raising = Session()
    raising.gate(broken)
    assert "KeyError" in str(asyncio.run(raising.authorize(invocation)))


def _result(call_id: str, attempt: int = 0, response: Any = 1) -> str:
    event = {
        "id": call_id,
        "created_at": "2026-01-01T00:00:00+00:00",
        "execution": {"status": "completed", "duration": 0.0, "response": response},
        "function": "echo",
        "arguments": {},
    }
    return CallResult(
        call_id=call_id, function="echo", event=event, attempt=attempt
    ).model_dump_json()


@pytest.mark.parametrize("multipop", [None, False], ids=["blmpop", "blpop-fallback"])
def test_collector_resolves_each_attempt_once_and_ignores_duplicates(
    redis_url: str, multipop: bool | None
) -> None:
    async def scenario() -> None:
        keys = Keys("unit-collector")
        reply_key = keys.reply("c")
        client = aioredis.Redis.from_url(redis_url)
        await client.delete(reply_key)
        collector = Collector(aioredis.Redis.from_url(redis_url), reply_key, keys.event)
        collector._multipop = multipop  # False: as against Redis 6.2, which has no BLMPOP
        collector.start()
        try:
            first = collector.expect("a", 0)
            retry = collector.expect("a", 1)
            await client.rpush(reply_key, _result("a", 0, "one"), _result("a", 0, "dup"))
            await client.rpush(reply_key, "not json", _result("stranger", 0))
            await client.rpush(reply_key, _result("a", 1, "two"))
            done = await asyncio.wait_for(asyncio.gather(first, retry), timeout=10)
            assert [r.execution["response"] for r in done] == ["one", "two"]
            assert collector.pending == 0
            assert await client.llen(reply_key) == 0
        finally:
            await collector.aclose()
            await client.delete(reply_key)
            await client.aclose()

    asyncio.run(scenario())


async def _until_blocked(
    watcher: aioredis.Redis, commands: tuple[str, ...], count: int, what: str
) -> None:
    """Until ``count`` connections wait in one of ``commands`` on the server (CLIENT LIST),
    for at most 10 s: a reply pushed after that is answered by the server at once."""

    async def blocked() -> bool:
        return sum(c.get("cmd") in commands for c in await watcher.client_list()) >= count

    await until_async(blocked, timeout_s=10, what=f"{what} to wait on the server")


def test_collector_keeps_a_reply_read_after_the_loop_was_busy_past_redis_pys_timeout(
    redis_url: str,
) -> None:
    """A large batched window keeps the loop busy; the pop's answer must survive it.

    redis-py's default 5 s read timeout counts loop time: a BLMPOP answered while the loop was
    busy for 6 s timed out and its replies were gone (only the stored records, absent here,
    could answer them)."""

    async def scenario() -> None:
        keys = Keys("unit-collector-busy-loop")
        reply_key = keys.reply("c")
        client = aioredis.Redis.from_url(redis_url)
        await client.delete(reply_key)
        collector = Collector(connect(redis_url), reply_key, keys.event)
        collector.start()
        try:
            late = collector.expect("late", 0)

            await _until_blocked(client, ("blmpop", "blpop"), 1, "the collector's pop")
            # The server answers the waiting pop at once; the loop, busy for 6 s without a
            # break (a blocking client and a blocking sleep), reads that answer only after.
            with redis.Redis.from_url(redis_url) as blocking:
                blocking.rpush(reply_key, _result("late", 0, "kept"))
            time.sleep(6.0)  # noqa: ASYNC251 - the busy loop itself, not a wait for anything
            result = await asyncio.wait_for(late, timeout=10)
            assert result.execution["response"] == "kept"
            assert await client.llen(reply_key) == 0
        finally:
            await collector.aclose()
            await client.delete(reply_key)
            await client.aclose()

    asyncio.run(scenario())


def test_the_fleets_other_clients_keep_a_reply_read_after_the_loop_was_busy(
    redis_url: str,
) -> None:
    """The history/publishing client and the reconciler's read as the collector's:
    a reply that arrived while the loop was busy for 6 s is read, not timed out."""
    keys = ["unit-busy-loop-history", "unit-busy-loop-reconciler"]

    async def scenario() -> list[Any]:
        fleet = Fleet(Settings(broker_url=redis_url))
        watcher = aioredis.Redis.from_url(redis_url)
        try:
            await watcher.delete(*keys)
            clients = [fleet.redis, fleet.reconciler.client]
            reads = [
                asyncio.ensure_future(client.blpop([key], timeout=3))
                for client, key in zip(clients, keys, strict=True)
            ]

            await _until_blocked(watcher, ("blpop",), 2, "both reads")
            # The server answers both at once; the loop reads the answers only after 6 s busy.
            with redis.Redis.from_url(redis_url) as blocking:
                for key in keys:
                    blocking.rpush(key, "kept")
            time.sleep(6.0)  # noqa: ASYNC251 - the busy loop itself, not a wait for anything
            return await asyncio.wait_for(asyncio.gather(*reads), timeout=10)
        finally:
            await watcher.delete(*keys)
            await watcher.aclose()
            await fleet.aclose()

    found = asyncio.run(scenario())
    assert [value for _, value in found] == [b"kept", b"kept"]


def test_collector_recovers_a_result_whose_reply_was_lost_from_its_stored_record(
    redis_url: str,
) -> None:
    """A pop answer lost in transit removed the reply; the durable record still answers."""

    async def scenario() -> None:
        keys = Keys("unit-collector-recover")
        client = aioredis.Redis.from_url(redis_url)
        collector = Collector(aioredis.Redis.from_url(redis_url), keys.reply("c"), keys.event)
        try:
            done = collector.expect("done", 0)
            retried = collector.expect("retried", 1)
            running = collector.expect("running", 0)
            await client.set(keys.event("done"), _result("done", 0, "stored"))
            # The stored record is attempt 0's; the wait is for attempt 1: not its answer.
            await client.set(keys.event("retried"), _result("retried", 0, "old"))
            assert await collector.recover() == 1
            assert done.done() and done.result().execution["response"] == "stored"
            assert not retried.done() and not running.done()
            assert sorted(collector.awaited()) == [("retried", 1), ("running", 0)]
        finally:
            await client.delete(keys.event("done"), keys.event("retried"))
            await collector.aclose()
            await client.aclose()

    asyncio.run(scenario())


def test_history_unit_is_json_in_redis_order(redis_url: str) -> None:
    from toolfleet.dispatcher.history.history import BranchHistory, Unit, link_pair, load_records
    from toolfleet.schemas.action import ActionResponseModel
    from toolfleet.schemas.record import EventRecord

    async def scenario() -> None:
        keys = Keys("unit-history")
        client = aioredis.Redis.from_url(redis_url)
        history = BranchHistory("b1")
        units = []
        for i in range(3):
            request, response = link_pair(
                function="echo", arguments={"value": i}, output=i, error=None, branch_id="b1"
            )
            record = EventRecord(id=f"event-{i}", execution={"status": "completed"})
            units.append(Unit(str(i), [record], request, response, ActionResponseModel(output=i)))
        try:
            assert await history.write(client, keys, units, record_ttl_s=60) is None
            messages, events = await load_records(client, keys, "b1")
            assert [m.id for m in messages] == [m.id for m in history.messages]
            assert [e.to_dict() for e in events] == [
                {"id": f"event-{i}", "execution": {"status": "completed"}} for i in range(3)
            ]
            assert messages[0].content.action_response_id == messages[1].id  # type: ignore[union-attr]
            assert (
                json.loads(await client.lindex(keys.history("b1"), 1))["role"] == "action_response"
            )
        finally:
            await client.delete(keys.history("b1"), keys.events("b1"))
            await client.aclose()

    asyncio.run(scenario())


def test_cancel_and_wait_stops_a_task_that_swallowed_its_first_cancellation() -> None:
    """redis-py can turn a cancel racing its socket timeout into TimeoutError; the fleet's
    background loops catch that and run on, so one cancel() left Fleet.aclose() hanging."""
    from toolfleet.dispatcher.infra.stopping import cancel_and_wait

    async def scenario() -> int:
        swallowed = 0

        async def background_loop() -> None:
            nonlocal swallowed
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    if swallowed:
                        raise
                    swallowed += 1
                    current = asyncio.current_task()
                    assert current is not None
                    current.uncancel()

        task = asyncio.ensure_future(background_loop())
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait(task), timeout=5)
        assert task.cancelled()
        return swallowed

    assert asyncio.run(scenario()) == 1


def test_a_settled_journal_opening_lets_go_of_the_batchs_calls() -> None:
    """The journal of a 100,000-call batch holds every call's arguments; kept
    until the batch ends it cost ~29 MB of the dispatcher's peak. Once its write is settled
    (sent with the first publish), the opening keeps only the batch id."""
    from toolfleet.dispatcher.history.journal import JournalCall, JournalEntry, JournalOpening

    calls = [JournalCall(call_id=f"c{i}", function="echo", arguments={"v": i}) for i in range(3)]
    entry = JournalEntry(batch_id="b1", branch_id="br", strategy="concurrent",
                         dispatcher_id="d", calls=calls)  # fmt: skip

    async def scenario() -> JournalOpening:
        opening = JournalOpening(Keys(), entry, ttl_s=60)
        assert opening.claim()
        assert opening.entry is entry  # still needed while the publish may be retried
        opening.settle(None)
        await asyncio.wait_for(opening.wait(), 1)
        return opening

    opening = asyncio.run(scenario())
    assert opening.entry is None
    assert opening.batch_id == "b1"
    with pytest.raises(RuntimeError, match="b1: its journal was already settled"):
        opening.add_to(object())


def test_asyncio_run_returns_when_the_collectors_cancel_comes_out_as_a_redis_error() -> None:
    """A loop's share closes by itself when ``asyncio.run`` ends, after asyncio has cancelled
    the leftover tasks once. redis-py can turn that cancel into a socket error, which the
    collector's reconnect handler caught and went on: ``asyncio.run`` never returned (CI hung
    in tests/integration/test_sync_api.py). The handler now stops when its task was cancelled."""
    import threading

    class CancelComesOutAsOSError:
        def __init__(self) -> None:
            self.reading = asyncio.Event()

        async def blmpop(self, *args: Any, **kwargs: Any) -> Any:
            self.reading.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                raise OSError("Timeout reading from 127.0.0.1:6379") from None

    async def main() -> None:
        client = CancelComesOutAsOSError()
        Collector(client, "reply", lambda call_id: call_id).start()  # type: ignore[arg-type]
        await asyncio.wait_for(client.reading.wait(), 5)
        # Returns with the collector still running: asyncio.run cancels it.

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "asyncio.run did not return: the collector ignored its cancel"
