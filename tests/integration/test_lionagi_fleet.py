"""lionagi on the fleet. ``on_fleet(branch)`` makes a real lionagi 0.36
Branch run its tool calls on real toolfleet workers as one batch, with lionagi's own history
receiving linked request/response pairs in input order and failures in
``ActionResponseContent.error``. No network: act() takes lionagi's own ActionRequests, and
operate() runs on lionagi's scripted model (``lionagi.testing``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from lionagi import Branch as LionagiBranch
from lionagi import Session as LionagiSession
from lionagi.operations.communicate.communicate import communicate
from lionagi.operations.fields import ActionRequestModel
from lionagi.protocols.generic.log import DataLoggerConfig
from lionagi.protocols.messages import ActionRequest as LionagiRequest
from lionagi.protocols.messages import ActionResponse as LionagiResponse
from lionagi.testing import TestBranch

from tests.support.fleet import call
from toolfleet.adapters.lionagi import bridge_of, on_fleet
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import Settings

pytestmark = pytest.mark.usefixtures("sync_worker", "async_worker")

# lionagi branches dump their logs to ./data/logs at exit unless told not to.
QUIET = DataLoggerConfig(auto_save_on_exit=False)


def _request(function: str, **arguments: Any) -> LionagiRequest:
    return LionagiRequest(content={"function": function, "arguments": arguments})


def _pairs(branch: Any) -> list[tuple[LionagiRequest, LionagiResponse]]:
    """lionagi's action messages as (request, response) pairs, asserting each pair is
    adjacent and linked both ways."""
    actions = [m for m in branch.messages if isinstance(m, LionagiRequest | LionagiResponse)]
    assert len(actions) % 2 == 0
    pairs = []
    for request, response in zip(actions[::2], actions[1::2], strict=True):
        assert isinstance(request, LionagiRequest) and isinstance(response, LionagiResponse)
        assert request.content.action_response_id == str(response.id)
        assert response.content.action_request_id == str(request.id)
        pairs.append((request, response))
    return pairs


def _count_batches(lbranch: Any) -> list[int]:
    """Wrap the bridge's toolfleet branch so each act() (one batch) is counted."""
    bridge = bridge_of(lbranch)
    assert bridge is not None
    sizes: list[int] = []
    act = bridge.branch.act

    async def counted(requests: Any, **kwargs: Any) -> Any:
        sizes.append(len(requests))
        return await act(requests, **kwargs)

    bridge.branch.act = counted  # type: ignore[method-assign]
    return sizes


def test_act_runs_on_the_fleet_as_one_batch_with_lionagis_history_in_order(
    fleet_settings: Settings,
) -> None:
    async def scenario() -> None:
        fleet = Fleet(fleet_settings)
        lbranch = on_fleet(LionagiBranch(log_config=QUIET), fleet=fleet)
        batches = _count_batches(lbranch)
        given = _request("whoami")
        secret = _request("with_secret", query="q", api_key="sk-very-secret")
        requests: list[Any] = [
            given,
            {"function": "sleep_async", "arguments": {"seconds": 0.2}},
            ActionRequestModel(function="add", arguments={"a": 2, "b": 3}),
            _request("fail", message="broken on purpose"),
            secret,
        ]
        results = await lbranch.act(requests)

        assert [r.function for r in results] == [
            "whoami",
            "sleep_async",
            "add",
            "fail",
            "with_secret",
        ]
        assert results[0].output["pid"] != os.getpid()  # ran in a worker process
        assert results[1].output == 0.2 and results[2].output == 5
        assert results[3].output is None  # lionagi's shape for a failed call
        assert results[4].output == {"query": "q", "api_key_length": 14}

        pairs = _pairs(lbranch)
        assert [req.content.function for req, _ in pairs] == [r.function for r in results]
        assert pairs[0][0] is given and pairs[4][0] is secret  # the given requests are kept
        assert [resp.content.error for _, resp in pairs[:3]] == [None, None, None]
        assert "broken on purpose" in (pairs[3][1].content.error or "")
        assert pairs[3][1].content.output["error"] == pairs[3][1].content.error
        assert pairs[4][0].content.arguments["api_key"] == "***"  # redacted in lionagi too
        assert "sk-very-secret" not in repr([m.content for m in lbranch.messages])

        # One toolfleet batch; its history is in Redis under lionagi's branch id.
        assert batches == [5]
        stored = await Branch.load(str(lbranch.id), fleet=fleet)
        assert [m.content.function for m in stored.messages[::2]] == [r.function for r in results]
        assert stored.messages[0].content.tool_call_id == str(given.id)
        await fleet.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_operate_with_actions_runs_the_models_calls_on_the_fleet(
    fleet_settings: Settings,
) -> None:
    """operate(actions=True) with lionagi's scripted model: the model's action requests run
    on the workers, and the history reads instruction, answer, then one linked pair per call
    in the model's order (lionagi alone writes both requests, then both responses)."""

    async def scenario() -> None:
        fleet = Fleet(fleet_settings)
        answer = {
            "action_required": True,
            "action_requests": [
                {"function": "sleep_async", "arguments": {"seconds": 0.3}},
                {"function": "add", "arguments": {"a": 1, "b": 2}},
                {"function": "whoami", "arguments": {}},
            ],
        }
        lbranch = on_fleet(
            TestBranch.from_responses([{"type": "structured", "data": answer}], log_config=QUIET),
            fleet=fleet,
        )
        batches = _count_batches(lbranch)
        # The scripted endpoint is a CLI-style one; communicate is the API models' path.
        result = await lbranch.operate(instruction="go", actions=True, middle=communicate)

        outputs = [r.output for r in result.action_responses]
        assert outputs[:2] == [0.3, 3] and outputs[2]["pid"] != os.getpid()
        # The fleet's tools were registered, so the model was shown their specs.
        sent = TestBranch.calls(lbranch)[0].payload["messages"][0]["content"]
        assert "sleep_async" in sent and "with_secret" in sent
        kinds = [type(m).__name__ for m in lbranch.messages]
        assert kinds[:2] == ["Instruction", "AssistantResponse"]
        assert [req.content.function for req, _ in _pairs(lbranch)] == [
            "sleep_async",
            "add",
            "whoami",
        ]
        assert batches == [3]
        await fleet.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_lionagis_gate_denies_on_the_fleet_and_other_branches_keep_lionagis_path(
    fleet_settings: Settings,
) -> None:
    async def scenario() -> None:
        fleet = Fleet(fleet_settings)
        session = LionagiSession(default_branch=LionagiBranch(log_config=QUIET))
        session.gate(lambda invocation: invocation.function != "add")
        lbranch = on_fleet(session.default_branch, fleet=fleet)
        results = await lbranch.act([_request("add", a=1, b=1), _request("echo", value="ok")])
        assert results[0].output == {"error": "denied by governance gate", "function": "add"}
        assert results[1].output == "ok"
        (_, denied), (_, allowed) = _pairs(lbranch)
        assert denied.content.error == "denied by governance gate"
        assert allowed.content.error is None

        # A branch never put on a fleet runs its tools locally, as lionagi does.
        def where() -> int:
            return os.getpid()

        local = LionagiBranch(tools=[where], log_config=QUIET)
        assert bridge_of(local) is None
        [here] = await local.act(_request("where"))
        assert here.output == os.getpid()
        await fleet.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_call_its_approver_denies_reaches_lionagi_as_the_refusal_the_model_reads(
    fleet_settings: Settings, tmp_path: Any
) -> None:
    """An approval=True tool on a lionagi branch on the fleet: an approval handler says no, and
    lionagi gets the refusal as the call's output (like a gate's denial), its history the
    error; the tool never ran (its side channel stays empty)."""
    settings = fleet_settings.model_copy(update={"tools": ("tests.support.approval_tools",)})
    side = tmp_path / "side"

    async def scenario() -> None:
        fleet = Fleet(settings)
        fleet.on_approval(lambda request: False)
        lbranch = on_fleet(LionagiBranch(log_config=QUIET), fleet=fleet)
        [result] = await lbranch.act(_request("refund", side=str(side), token=1, amount=5))
        refusal = "call of tool 'refund' was not run: denied by handler <lambda>"
        assert result.output == {"error": refusal, "function": "refund"}
        [(_, response)] = _pairs(lbranch)
        assert response.content.error == refusal
        await fleet.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert not side.exists()


def test_toolfleet_act_accepts_lionagi_requests_and_on_fleet_refuses_other_branches(
    fleet_settings: Settings,
) -> None:
    request = _request("add", a=4, b=5)
    branch = Branch(fleet=Fleet(fleet_settings))
    [result] = branch.act_sync([request])
    assert result.output == 9 and result.tool_call_id == str(request.id)
    assert branch.messages[0].content.tool_call_id == str(request.id)
    with pytest.raises(ConfigurationError, match="takes a lionagi Branch"):
        on_fleet(branch)
    assert [r.output for r in branch.act_sync(call("add", a=1, b=1))] == [2]


def test_lionagis_hooks_guard_and_observe_calls_on_the_fleet(fleet_settings: Settings) -> None:
    """A lionagi TOOL_PRE guard stays in force on the fleet (its raise stops only that call,
    which never reaches a worker); TOOL_POST and TOOL_ERROR see the fleet's outcomes."""
    from lionagi.hooks.bus import HookBus, HookPoint

    async def scenario() -> None:
        fleet = Fleet(fleet_settings)
        lbranch = LionagiBranch(log_config=QUIET)
        bus = HookBus()
        lbranch.attach_hook_bus(bus)
        seen: dict[str, list[str]] = {"post": [], "error": []}

        def guard(tool_name: str, **_: Any) -> None:
            if tool_name == "echo":
                raise PermissionError("echo is not allowed here")

        bus.on(HookPoint.TOOL_PRE, guard)
        bus.on(HookPoint.TOOL_POST, lambda tool_name, **_: seen["post"].append(tool_name))
        bus.on(HookPoint.TOOL_ERROR, lambda tool_name, **_: seen["error"].append(tool_name))
        on_fleet(lbranch, fleet=fleet)

        results = await lbranch.act(
            [_request("add", a=1, b=1), _request("echo", value="x"), _request("fail")]
        )
        assert [r.output for r in results] == [2, None, None]
        (_, added), (_, guarded), (_, failed) = _pairs(lbranch)
        assert added.content.error is None
        assert "echo is not allowed here" in (guarded.content.error or "")
        assert "boom" in (failed.content.error or "")
        assert seen == {"post": ["add"], "error": ["echo", "fail"]}
        # The guarded call was never enqueued: toolfleet recorded it ABORTED.
        stored = await Branch.load(str(lbranch.id), fleet=fleet)
        assert [e.execution["status"] for e in stored.events if e.function == "echo"] == ["aborted"]
        await fleet.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 120))
