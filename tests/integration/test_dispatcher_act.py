"""Branch.act end to end: the per-call transaction over real Redis and real workers.

Every test mixes sync tools (prefork worker) and async tools (asyncio-pool worker), and
asserts the returned models, the history, the events, the hooks and the signals.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import datetime
from typing import Any, TypeVar

import pytest
import redis
from pydantic import BaseModel

from tests.support.fleet import REPO_ROOT, WorkerProcess, assert_linked_pairs, call, run
from toolfleet.dispatcher import (
    Branch,
    CallbackFailed,
    Fleet,
    GateDenied,
    HookPoint,
    PermissionPolicy,
    Session,
    StopHook,
)
from toolfleet.schemas.action import ActionResponseModel, ToolInvocation
from toolfleet.schemas.errors import MalformedRequestError, UnknownToolError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.messages import ActionRequest, ActionResponse
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.usefixtures("sync_worker", "async_worker")

T = TypeVar("T")
DENIED = {"error": "denied by governance gate"}


class Recorder:
    """Records every hook payload of a branch, by point."""

    def __init__(self, branch: Branch) -> None:
        self.seen: dict[HookPoint, list[dict[str, Any]]] = {p: [] for p in HookPoint}
        for point in HookPoint:
            branch.hooks.on(point, self.seen[point].append)

    def call_ids(self, point: HookPoint) -> list[str]:
        return [p["call_id"] for p in self.seen[point]]


def assert_linked_history(branch: Branch, results: list[ActionResponseModel]) -> None:
    """Request, then its linked response, per call, in input order; one pair per result."""
    assert_linked_pairs(branch, results)
    messages = branch.messages
    for i, result in enumerate(results):
        request, response = messages[2 * i], messages[2 * i + 1]
        assert isinstance(request, ActionRequest) and isinstance(response, ActionResponse)
        assert request.function == result.function
        assert response.content.output == result.output
        assert response.success is (result.error is None)


def finished_at(event: EventRecord) -> float:
    created = datetime.fromisoformat(str(event.created_at)).timestamp()
    return float(created + (event.execution["duration"] or 0.0))


def test_mixed_batch_completes_out_of_order_and_returns_in_input_order(
    fleet_settings: Settings, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    requests = [
        call("sleep_async", seconds=0.8),
        call("echo", value="fast"),
        call("add", a=2, b=3),
        call("whoami_async"),
        call("sleep_sync", seconds=0.3),
    ]

    async def scenario(fleet: Fleet) -> tuple[Branch, Recorder, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        hooks = Recorder(branch)
        return branch, hooks, await branch.act(requests)

    branch, hooks, results = run(fleet_settings, scenario)

    assert [r.function for r in results] == [r["function"] for r in requests]
    assert [r.output for r in results[:3]] == [0.8, "fast", 5]
    assert results[4].output == 0.3
    assert all(r.status is EventStatus.COMPLETED and r.success for r in results)
    assert len({r.call_id for r in results}) == 5
    assert_linked_history(branch, results)
    # Sync tools ran in the prefork worker, async ones on the asyncio pool.
    workers = [e.worker for e in branch.events]
    assert workers[0] == workers[3] == async_worker.hostname
    assert workers[1] == workers[2] == workers[4] == sync_worker.hostname
    # Completion order differs from input order: echo finished long before sleep_async.
    assert finished_at(branch.events[1]) < finished_at(branch.events[0])
    assert [e.call_id for e in branch.events] == [r.call_id for r in results]
    assert [e.execution["status"] for e in branch.events] == ["completed"] * 5
    ids = [r.call_id for r in results]
    assert hooks.call_ids(HookPoint.TOOL_PRE) == ids
    assert hooks.call_ids(HookPoint.TOOL_POST) == ids  # emitted in input order
    assert hooks.seen[HookPoint.TOOL_ERROR] == []
    pre = hooks.seen[HookPoint.TOOL_PRE][2]
    assert pre["tool_name"] == "add" and pre["arguments"] == str({"a": 2, "b": 3})
    post = hooks.seen[HookPoint.TOOL_POST][1]
    assert post["response"] == "fast" and post["duration"] >= 0
    assert branch.signals == []


def test_single_request_is_wrapped_and_empty_list_produces_nothing(
    fleet_settings: Settings,
) -> None:
    async def scenario(fleet: Fleet) -> tuple[Branch, list[Any], list[Any], Recorder]:
        branch = Branch(fleet=fleet)
        hooks = Recorder(branch)
        empty = await branch.act([])
        assert branch.messages == [] and branch.events == []
        single = await branch.act(call("add", a=1, b=1))
        return branch, empty, single, hooks

    branch, empty, single, hooks = run(fleet_settings, scenario)
    assert empty == []
    assert len(single) == 1 and single[0].output == 2
    assert len(branch.messages) == 2 and len(branch.events) == 1
    assert len(hooks.seen[HookPoint.TOOL_PRE]) == 1


def test_envelopes_actionrequest_model_and_dict_are_all_accepted(fleet_settings: Settings) -> None:
    class Proposal(BaseModel):
        function: str
        arguments: dict[str, Any]

    request = ActionRequest.model_validate(
        {"content": {"function": "add", "arguments": {"a": 1, "b": 2}}}
    )

    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        return await Branch(fleet=fleet).act(
            [request, Proposal(function="echo", arguments={"value": "m"}), call("add", a=3, b=4)]
        )

    assert [r.output for r in run(fleet_settings, scenario)] == [3, "m", 7]


def test_failed_calls_get_a_linked_error_response_c1(fleet_settings: Settings) -> None:
    async def scenario(fleet: Fleet) -> tuple[Branch, Recorder, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        hooks = Recorder(branch)
        results = await branch.act(
            [call("fail", message="sync broke"), call("echo", value=1), call("fail_async")]
        )
        return branch, hooks, results

    branch, hooks, results = run(fleet_settings, scenario)
    assert [r.status for r in results] == [
        EventStatus.FAILED,
        EventStatus.COMPLETED,
        EventStatus.FAILED,
    ]
    assert results[0].error == "ValueError: sync broke"
    assert results[2].error == "ValueError: boom"
    assert not results[0].success and results[1].success
    assert_linked_history(branch, results)
    requests = [m for m in branch.messages if isinstance(m, ActionRequest)]
    assert all(r.is_responded() for r in requests)
    assert branch.messages[1].content.error == "ValueError: sync broke"  # type: ignore[union-attr]
    assert [e.execution["status"] for e in branch.events] == ["failed", "completed", "failed"]
    assert branch.events[0].execution["error"] == {
        "error": "ValueError",
        "message": "sync broke",
        "module": "builtins",
    }
    # A captured failure is a returned event: TOOL_POST, with its status.
    assert [p["status"] for p in hooks.seen[HookPoint.TOOL_POST]] == [
        "failed",
        "completed",
        "failed",
    ]
    assert hooks.seen[HookPoint.TOOL_ERROR] == []


def test_none_output_gets_its_linked_response_c2(fleet_settings: Settings) -> None:
    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        return branch, await branch.act([call("returns_none"), call("echo", value=None)])

    branch, results = run(fleet_settings, scenario)
    assert len(results) == 2  # output_dropna drops None *results*, not None outputs
    assert [r.output for r in results] == [None, None]
    assert all(r.success and r.status is EventStatus.COMPLETED for r in results)
    assert_linked_history(branch, results)
    assert all(m.content.output is None for m in branch.messages[1::2])  # type: ignore[union-attr]


def test_gate_denial_is_a_value_with_a_signal_and_nothing_enqueued(
    fleet_settings: Settings, redis_client: redis.Redis
) -> None:
    session = Session()
    seen: list[ToolInvocation] = []

    async def no_adding(invocation: ToolInvocation) -> bool:
        seen.append(invocation)
        return invocation.function != "add"

    session.gate(no_adding)

    async def scenario(fleet: Fleet) -> tuple[Branch, Recorder, list[ActionResponseModel]]:
        session.fleet = fleet
        branch = session.new_branch()
        hooks = Recorder(branch)
        results = await branch.act(
            [call("echo", value=1), call("add", a=1, b=2), call("sleep_async", seconds=0.1)],
            suppress_errors=False,  # denial is a value whatever suppress_errors says
        )
        return branch, hooks, results

    branch, hooks, results = run(fleet_settings, scenario)
    denied = results[1]
    assert denied.output == {**DENIED, "function": "add"}
    assert denied.status is EventStatus.SKIPPED and not denied.success
    assert [r.output for r in (results[0], results[2])] == [1, 0.1]
    assert_linked_history(branch, results)
    assert branch.messages[3].content.output == {**DENIED, "function": "add"}  # type: ignore[union-attr]
    # No event, no hook, nothing on the broker for the denied call.
    assert [e.call_id for e in branch.events] == [results[0].call_id, results[2].call_id]
    for point in HookPoint:
        assert denied.call_id not in hooks.call_ids(point)
    assert redis_client.get(Keys().event(str(denied.call_id))) is None
    assert [type(s) for s in session.signals] == [GateDenied]
    signal = session.signals[0]
    assert isinstance(signal, GateDenied)
    assert (signal.call_id, signal.function) == (denied.call_id, "add")
    assert branch.signals == session.signals
    assert [i.branch_id for i in seen] == [branch.id] * 3


def test_raising_or_falsy_gate_denies(fleet_settings: Settings) -> None:
    session = Session()

    def picky(invocation: ToolInvocation) -> Any:
        if invocation.function == "echo":
            raise RuntimeError("gate backend down")
        return None  # falsy

    session.gate(picky)

    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        return await Branch(session, fleet=fleet).act(
            [call("echo", value=1), call("add", a=1, b=1)]
        )

    results = run(fleet_settings, scenario)
    assert [r.output for r in results] == [
        {**DENIED, "function": "echo"},
        {**DENIED, "function": "add"},
    ]
    reasons = [s.reason for s in session.signals if isinstance(s, GateDenied)]
    assert "RuntimeError: gate backend down" in reasons[0] and "None" in reasons[1]


def test_gate_pre_hook_and_policy_see_one_normalized_context_c4(fleet_settings: Settings) -> None:
    class AddArgs(BaseModel):
        a: int
        b: int

    session = Session()
    gate_saw: list[dict[str, Any]] = []
    hook_saw: list[dict[str, Any]] = []
    policy_saw: list[dict[str, Any]] = []
    session.gate(lambda inv: gate_saw.append(inv.arguments) or True)

    def watch(tool: str, action: str, args: dict[str, Any]) -> bool:
        policy_saw.append(args)
        return True

    policy = PermissionPolicy(escalate={"add": ["*"]}, on_escalate=watch)

    async def scenario(fleet: Fleet) -> tuple[list[str], list[ActionResponseModel]]:
        branch = Branch(session, fleet=fleet)
        branch.hooks.on(HookPoint.TOOL_PRE, lambda p: hook_saw.append(p["context"].arguments))
        policy.install(branch)
        pre_ids: list[str] = []
        branch.hooks.on(HookPoint.TOOL_PRE, lambda p: pre_ids.append(p["call_id"]))
        results = await branch.act({"function": "add", "arguments": AddArgs(a=1, b=2)})
        return pre_ids, results

    pre_ids, results = run(fleet_settings, scenario)
    # The ADR's raw gate would have seen {} for a model; every phase sees the same dict.
    assert gate_saw == hook_saw == policy_saw == [{"a": 1, "b": 2}]
    assert results[0].output == 3 and pre_ids == [results[0].call_id]


def test_pre_hook_exception_aborts_only_that_call_c3(
    fleet_settings: Settings, redis_client: redis.Redis
) -> None:
    def guard(payload: dict[str, Any]) -> None:
        if payload["tool_name"] == "echo":
            raise RuntimeError("echo is off limits")

    async def scenario(
        fleet: Fleet, suppress: bool
    ) -> tuple[Branch, Recorder, list[ActionResponseModel] | BaseException]:
        branch = Branch(fleet=fleet)
        hooks = Recorder(branch)
        branch.hooks.on(HookPoint.TOOL_PRE, guard)
        batch = [call("sleep_async", seconds=0.3), call("echo", value=1), call("add", a=1, b=1)]
        try:
            return branch, hooks, await branch.act(batch, suppress_errors=suppress)
        except RuntimeError as exc:
            return branch, hooks, exc

    branch, hooks, results = run(fleet_settings, lambda f: scenario(f, True))
    assert isinstance(results, list)
    aborted = results[1]
    assert aborted.status is EventStatus.ABORTED
    assert aborted.error == "RuntimeError: echo is off limits"
    assert [results[0].output, results[2].output] == [0.3, 2]
    assert_linked_history(branch, results)
    assert [e.execution["status"] for e in branch.events] == [
        "completed",
        "aborted",
        "completed",
    ]
    assert branch.events[1].call_id == aborted.call_id
    errors = hooks.seen[HookPoint.TOOL_ERROR]
    assert [p["call_id"] for p in errors] == [aborted.call_id]
    assert isinstance(errors[0]["error"], RuntimeError) and errors[0]["duration"] is None
    assert aborted.call_id not in hooks.call_ids(HookPoint.TOOL_POST)
    assert redis_client.get(Keys().event(str(aborted.call_id))) is None  # never enqueued

    branch, hooks, raised = run(fleet_settings, lambda f: scenario(f, False))
    assert isinstance(raised, RuntimeError) and "off limits" in str(raised)
    # Raised after history is written: the call in flight and the aborted one are there;
    # the call not yet started is never started (the ADR cancels outstanding siblings).
    assert len(branch.messages) == 4
    assert branch.messages[1].content.output == 0.3  # type: ignore[union-attr]
    assert branch.messages[3].content.error == "RuntimeError: echo is off limits"  # type: ignore[union-attr]
    assert [e.execution["status"] for e in branch.events] == ["completed", "aborted"]
    assert [p["tool_name"] for p in hooks.seen[HookPoint.TOOL_PRE]] == ["sleep_async", "echo"]


def test_stop_hook_skips_remaining_pre_handlers_but_not_the_call(fleet_settings: Settings) -> None:
    ran: list[str] = []

    def stopper(payload: dict[str, Any]) -> None:
        ran.append("stopper")
        raise StopHook

    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        branch = Branch(fleet=fleet)
        branch.hooks.on(HookPoint.TOOL_PRE, stopper)
        branch.hooks.on(HookPoint.TOOL_PRE, lambda p: ran.append("never"))
        return await branch.act(call("sleep_async", seconds=0.05))

    results = run(fleet_settings, scenario)
    assert ran == ["stopper"]
    assert results[0].status is EventStatus.COMPLETED and results[0].output == 0.05


def test_post_and_error_hook_failures_are_isolated_and_recorded(fleet_settings: Settings) -> None:
    after: list[str] = []

    def broken(payload: dict[str, Any]) -> None:
        raise KeyError("observer bug")

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        branch.hooks.on(HookPoint.TOOL_POST, broken)
        branch.hooks.on(HookPoint.TOOL_POST, lambda p: after.append(p["call_id"]))
        branch.hooks.on(HookPoint.TOOL_ERROR, broken)
        results = await branch.act([call("echo", value=1), call("no_such_tool")])
        return branch, results

    branch, results = run(fleet_settings, scenario)
    assert results[0].output == 1 and results[1].status is EventStatus.ABORTED
    assert after == [results[0].call_id]
    assert_linked_history(branch, results)
    failed = [s for s in branch.signals if isinstance(s, CallbackFailed)]
    assert [(s.call_id, s.where) for s in failed] == [
        (results[0].call_id, "tool_post"),
        (results[1].call_id, "tool_error"),
    ]
    assert "KeyError" in failed[0].error


def test_manager_exceptions_are_suppressed_values_or_raised_after_history(
    fleet_settings: Settings,
) -> None:
    big = "x" * (fleet_settings.max_argument_bytes + 1)
    batch = [
        call("no_such_tool", x=1),
        call("add", a=1),  # missing b: validation fails at construction
        call("echo", value=1),
        {"function": "echo", "arguments": {"value": {1, 2}}},  # a set is not JSON
        call("echo", value=big),
    ]

    async def scenario(fleet: Fleet) -> tuple[Branch, Recorder, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        hooks = Recorder(branch)
        return branch, hooks, await branch.act(batch)

    branch, hooks, results = run(fleet_settings, scenario)
    assert [r.status for r in results] == [
        EventStatus.ABORTED,
        EventStatus.ABORTED,
        EventStatus.COMPLETED,
        EventStatus.ABORTED,
        EventStatus.ABORTED,
    ]
    assert str(results[0].error).startswith("UnknownToolError: no tool named 'no_such_tool'")
    # Refused by this program's registry before it was sent: no worker was asked.
    assert "registered in this program" in str(results[0].error)
    assert "worker's registry" not in str(results[0].error)
    assert str(results[1].error).startswith("ArgumentValidationError:")
    assert "'b'" in str(results[1].error)
    assert str(results[3].error).startswith("NotJSONError: argument 'value'")
    assert str(results[4].error).startswith("OversizedArgumentsError:")
    assert results[0].output["function"] == "no_such_tool"
    assert_linked_history(branch, results)
    assert [e.execution["status"] for e in branch.events] == [
        "aborted",
        "aborted",
        "completed",
        "aborted",
        "aborted",
    ]
    assert branch.events[0].arguments == {"x": "***"}  # unknown tool: values hidden
    errored = [r.call_id for i, r in enumerate(results) if i != 2]
    assert hooks.call_ids(HookPoint.TOOL_ERROR) == errored
    # Validation runs before the pre-hooks; the JSON and size checks after them.
    assert hooks.call_ids(HookPoint.TOOL_PRE) == [r.call_id for r in results[2:]]

    async def unsuppressed(fleet: Fleet) -> tuple[Branch, BaseException]:
        branch = Branch(fleet=fleet)
        with pytest.raises(UnknownToolError) as info:
            await branch.act(
                [call("sleep_async", seconds=0.2), call("no_such_tool")], suppress_errors=False
            )
        return branch, info.value

    branch, error = run(fleet_settings, unsuppressed)
    assert "no_such_tool" in str(error)
    assert len(branch.messages) == 4  # the call in flight and the failed one, both written
    assert branch.messages[1].content.output == 0.2  # type: ignore[union-attr]
    assert str(branch.messages[3].content.error).startswith("UnknownToolError")  # type: ignore[union-attr]


def test_malformed_request_fails_alone_or_raises_before_anything_is_enqueued(
    fleet_settings: Settings,
) -> None:
    async def suppressed(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        return branch, await branch.act([call("echo", value=1), {"function": "echo"}])

    branch, results = run(fleet_settings, suppressed)
    assert results[0].output == 1
    assert results[1].status is EventStatus.ABORTED
    assert str(results[1].error).startswith("MalformedRequestError:")
    assert_linked_history(branch, results)

    async def unsuppressed(fleet: Fleet) -> tuple[Branch, Recorder]:
        branch = Branch(fleet=fleet)
        hooks = Recorder(branch)
        with pytest.raises(ValueError) as info:
            await branch.act([call("echo", value=1), "not a request"], suppress_errors=False)
        assert isinstance(info.value, MalformedRequestError)
        return branch, hooks

    branch, hooks = run(fleet_settings, unsuppressed)
    assert branch.messages == [] and branch.events == []
    assert all(v == [] for v in hooks.seen.values())


def test_observer_and_message_callback_failures_never_split_a_unit_c5(
    fleet_settings: Settings,
) -> None:
    session = Session()
    observed: list[str | None] = []

    def bad_observer(record: EventRecord) -> None:
        raise RuntimeError("observer down")

    session.subscribe(bad_observer)
    session.subscribe(lambda record: observed.append(record.call_id))

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel], list[int]]:
        branch = Branch(session, fleet=fleet)
        sizes: list[int] = []

        async def bad_callback(message: Any) -> None:
            # When a callback runs, the unit is whole: events and messages both there.
            sizes.append(len(branch.messages) - 2 * len(branch.events))
            raise ValueError("callback bug")

        branch.on_message(bad_callback)
        results = await branch.act([call("add", a=1, b=1), call("sleep_async", seconds=0.1)])
        return branch, results, sizes

    branch, results, sizes = run(fleet_settings, scenario)
    assert [r.output for r in results] == [2, 0.1]
    assert_linked_history(branch, results)
    assert len(branch.events) == 2
    assert observed == [r.call_id for r in results]
    assert sizes == [0, 0, 0, 0]
    wheres = sorted(s.where for s in session.signals if isinstance(s, CallbackFailed))
    assert wheres == [
        "observer",
        "observer",
        "on_message",
        "on_message",
        "on_message",
        "on_message",
    ]


def test_secret_arguments_never_reach_history_or_events(
    fleet_settings: Settings, redis_client: redis.Redis
) -> None:
    secret = "sk-very-secret-value"

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        return branch, await branch.act(call("with_secret", query="q", api_key=secret))

    branch, results = run(fleet_settings, scenario)
    assert results[0].output == {"query": "q", "api_key_length": len(secret)}  # tool got it
    assert results[0].arguments == {"query": "q", "api_key": "***"}
    assert branch.messages[0].content.arguments["api_key"] == "***"
    assert branch.events[0].arguments["api_key"] == "***"
    keys = Keys()
    stored = redis_client.lrange(keys.history(branch.id), 0, -1)
    stored += redis_client.lrange(keys.events(branch.id), 0, -1)
    assert stored and all(secret.encode() not in raw for raw in stored)


def test_permission_policy_installed_on_a_branch_takes_the_c3_path(
    fleet_settings: Settings,
) -> None:
    policy = PermissionPolicy(
        deny={"echo": ["rm*"]},
        escalate={"add": ["*"]},
        on_escalate=lambda tool, action, args: args.get("a") == 1,
        action_arg="value",
    )

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        policy.install(branch)
        return branch, await branch.act(
            [
                call("echo", value="rm -rf /"),
                call("echo", value="ls"),
                call("add", a=1, b=1),
                call("add", a=2, b=1),
            ]
        )

    branch, results = run(fleet_settings, scenario)
    assert [r.status for r in results] == [
        EventStatus.ABORTED,
        EventStatus.COMPLETED,
        EventStatus.COMPLETED,
        EventStatus.ABORTED,
    ]
    assert str(results[0].error).startswith("PermissionError: permission denied")
    assert "refused by on_escalate" in str(results[3].error)
    assert_linked_history(branch, results)


def test_branch_history_loads_by_id_from_another_process(fleet_settings: Settings) -> None:
    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        results = await branch.act([call("sleep_async", seconds=0.2), call("fail"), call("echo")])
        loaded = await Branch.load(branch.id, fleet=fleet)
        assert [m.id for m in loaded.messages] == [m.id for m in branch.messages]
        return branch, results

    branch, results = run(fleet_settings, scenario)
    reader = (
        "import asyncio, json, sys\n"
        "from dispatcher import Branch, Fleet\n"
        "async def main():\n"
        "    fleet = Fleet.from_env()\n"
        "    b = await Branch.load(sys.argv[1], fleet=fleet)\n"
        "    print(json.dumps({'messages': [m.model_dump(mode='json') for m in b.messages],\n"
        "                      'events': [e.to_dict() for e in b.events]}))\n"
        "    await fleet.aclose()\n"
        "asyncio.run(main())\n"
    )
    env = {"TOOLFLEET_BROKER_URL": str(fleet_settings.broker_url), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", reader, branch.id],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert [m["id"] for m in data["messages"]] == [m.id for m in branch.messages]
    assert [m["role"] for m in data["messages"]] == ["action_request", "action_response"] * 3
    assert data["messages"][3]["content"]["error"] == "ValueError: boom"
    assert data["messages"][1]["content"]["output"] == 0.2
    assert [e["call_id"] for e in data["events"]] == [r.call_id for r in results]


def test_standalone_branch_uses_the_process_default_fleet_across_event_loops(
    fleet_settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from toolfleet.dispatcher import fleet as fleet_module

    monkeypatch.setenv("TOOLFLEET_BROKER_URL", str(fleet_settings.broker_url))
    monkeypatch.setenv("TOOLFLEET_TOOLS", "tests.support.sample_tools")
    monkeypatch.setattr(fleet_module, "_default", None)

    async def once(value: int) -> list[ActionResponseModel]:
        return await Branch().act(call("echo", value=value), verbose_action=True)

    caplog.set_level("INFO", logger="toolfleet.dispatcher.batch.act")
    # Two event loops in turn: the default fleet re-binds its clients to each.
    assert asyncio.run(once(1))[0].output == 1
    default = Branch().fleet
    assert asyncio.run(once(2))[0].output == 2
    assert Branch().fleet is default
    assert default.settings.broker_url == fleet_settings.broker_url
    assert "echo({'value': 2})" in caplog.text  # verbose_action logs each call

    async def close() -> None:
        await default.aclose()

    asyncio.run(close())
