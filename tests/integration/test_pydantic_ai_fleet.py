"""Pydantic AI on the fleet: ``FleetToolset`` runs an agent's tool calls on real workers, one
batch per model turn, with the model's ids kept; a ``ModelRetry`` raised on a worker makes the
model try again, invalid arguments are Pydantic AI's retry prompt; a replayed turn is not run
again (C7), cancelling the run reaches the workers (C9), gates and TOOL_PRE hooks apply. The
model is Pydantic AI's ``FunctionModel`` (no network).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.support.agent_fleet import (
    AgentFleet,
    agent_fleet,
    assert_cancelled_everywhere,
    cancel_once_running,
    documented_glue,
)
from tests.support.fleet import run
from toolfleet import Branch, Fleet, HookPoint, PermissionPolicy, Session
from toolfleet.adapters.pydantic_ai import FleetToolset
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings

Script = Callable[[list[ModelMessage], AgentInfo], ModelResponse]


@pytest.fixture(scope="module")
def pa(fleet_settings: Settings, redis_url: str) -> Iterator[AgentFleet]:
    with agent_fleet(fleet_settings, redis_url, "pydantic-ai") as fleet:
        yield fleet


def turns(*responses: list[tuple[str, dict[str, Any], str]] | str) -> tuple[Script, list[Any]]:
    """A model that answers each request with the next turn: tool calls or a text; and the
    list of what it was sent."""
    seen: list[list[ModelMessage]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        turn = responses[len(seen) - 1]
        if isinstance(turn, str):
            return ModelResponse(parts=[TextPart(turn)])
        return ModelResponse(
            parts=[ToolCallPart(name, args, tool_call_id=id) for name, args, id in turn]
        )

    return model, seen


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def conversation() -> str:
    return f"conv-{uuid.uuid4().hex[:8]}"


def test_a_turns_parallel_calls_run_on_the_fleet_as_one_batch(pa: AgentFleet) -> None:
    model, _ = turns(
        [
            ("whoami", {}, "call_who"),
            ("sleep_async", {"seconds": 0.3}, "call_sleep"),
            ("add", {"a": 2, "b": 3}, "call_add"),
            ("fail", {"message": "broken on purpose"}, "call_fail"),
            ("closed_shop", {"item": "bread"}, "call_shop"),
        ],
        "done",
    )
    conv = conversation()

    async def scenario(fleet: Fleet) -> tuple[Any, FleetToolset, Branch]:
        toolset = FleetToolset(fleet=fleet, tool_errors_as_results=True)
        result = await Agent(FunctionModel(model), toolsets=[toolset]).run(
            "go", conversation_id=conv
        )
        branch_id = toolset.branch_id(conv)
        assert branch_id == f"pydantic-ai:{conv}"
        return result, toolset, await Branch.load(branch_id, fleet=fleet)

    result, toolset, stored = run(pa.settings, scenario)

    assert result.output == "done"
    parts = returns(result.all_messages())
    assert [p.tool_call_id for p in parts] == [
        "call_who",
        "call_sleep",
        "call_add",
        "call_fail",
        "call_shop",
    ]
    assert pa.runs_in_a_worker(parts[0].content["pid"])
    assert [p.content for p in parts[1:3]] == [0.3, 5]
    # tool_errors_as_results: a tool's exception is a failed result the model sees (C1);
    # ToolFailed raised on the worker is Pydantic AI's own ToolFailed.
    assert (parts[3].outcome, parts[3].content) == ("failed", "ValueError: broken on purpose")
    assert (parts[4].outcome, parts[4].content) == (
        "failed",
        "the shop is closed; bread cannot be bought today",
    )
    assert list(toolset.batcher.batch_sizes) == [5]
    # toolfleet's history of the conversation: the model's order, the model's ids.
    assert [m.content.tool_call_id for m in stored.messages[::2]] == [p.tool_call_id for p in parts]


def test_a_model_retry_raised_on_a_worker_makes_the_model_try_again(pa: AgentFleet) -> None:
    model, seen = turns(
        [
            ("city_weather", {"city": "paris"}, "call_lower"),
            ("add", {"a": 1, "b": 2}, "call_add"),
            ("add", {"a": "two", "b": 2}, "call_invalid"),
        ],
        [("city_weather", {"city": "Paris"}, "call_proper")],
        "done",
    )
    conv = conversation()

    async def scenario(fleet: Fleet) -> tuple[Any, FleetToolset, Branch]:
        toolset = FleetToolset(["city_weather", "add"], fleet=fleet)
        agent = Agent(FunctionModel(model), toolsets=[toolset])
        result = await agent.run("weather?", conversation_id=conv)
        branch_id = toolset.branch_id(conv)
        assert branch_id is not None
        return result, toolset, await Branch.load(branch_id, fleet=fleet)

    result, toolset, stored = run(pa.settings, scenario)

    assert result.output == "done"
    lower, added, invalid, proper = returns(result.all_messages())
    # The worker's ModelRetry is the model's retry prompt, with the tool's message.
    assert lower.outcome == "retried"
    assert lower.content == "write the city as a proper name, 'Paris', not 'paris'"
    assert (added.outcome, added.content) == ("success", 3)
    # Arguments that do not fit the tool's schema: Pydantic AI's retry prompt (a local tool's
    # validation errors), nothing sent.
    assert invalid.outcome == "retried"
    assert [(e["loc"], e["type"]) for e in invalid.content] == [(["a"], "float_parsing")]
    assert proper.outcome == "success" and pa.runs_in_a_worker(proper.content["pid"])
    # The model was sent the retry before its second turn.
    second_request = seen[1][-1]
    assert isinstance(second_request, ModelRequest)
    assert any("proper name" in str(getattr(p, "content", "")) for p in second_request.parts)
    assert list(toolset.batcher.batch_sizes) == [2, 1]
    errors = [m.content.error for m in stored.messages[1::2]]
    assert [m.content.tool_call_id for m in stored.messages[::2]] == [
        "call_lower",
        "call_add",
        "call_proper",
    ]
    assert str(errors[0]).startswith("ModelRetry: write the city")
    assert errors[1:] == [None, None]


def test_a_replayed_turn_in_the_same_conversation_does_not_run_its_tools_again(
    pa: AgentFleet, tmp_path: Path
) -> None:
    """C7: the conversation's branch derives call ids from the model's ids."""
    path = tmp_path / "effects.txt"
    turn = [("append_line", {"path": str(path), "text": "once"}, "call_effect")]
    conv = conversation()

    async def scenario(fleet: Fleet) -> list[Any]:
        outputs = []
        for conv_id in (conv, conv, conversation()):
            model, _ = turns(turn, "done")
            agent = Agent(FunctionModel(model), toolsets=[FleetToolset(fleet=fleet)])
            result = await agent.run("go", conversation_id=conv_id)
            outputs.append(returns(result.all_messages())[0].content)
        return outputs

    first, replayed, other = run(pa.settings, scenario)
    assert (first, replayed, other) == (1, 1, 2)
    assert path.read_text().splitlines() == ["once", "once"]


def test_cancelling_the_agent_run_cancels_the_calls_on_the_workers(
    pa: AgentFleet, redis_client: redis.Redis
) -> None:
    keys = Keys(pa.settings.key_prefix)
    model, _ = turns(
        [
            ("sleep_async", {"seconds": 30}, "long_1"),
            ("sleep_async", {"seconds": 30}, "long_2"),
        ],
        "never",
    )
    conv = conversation()
    started: list[str] = []

    async def scenario(fleet: Fleet) -> tuple[float, Branch]:
        toolset = FleetToolset(["sleep_async"], fleet=fleet)
        toolset.hooks.on(HookPoint.TOOL_PRE, lambda p: started.append(p["call_id"]))
        agent = Agent(FunctionModel(model), toolsets=[toolset])
        task = asyncio.ensure_future(agent.run("go", conversation_id=conv))
        elapsed = await cancel_once_running(task, started, redis_client, keys)
        branch_id = toolset.branch_id(conv)
        assert branch_id is not None
        return elapsed, await Branch.load(branch_id, fleet=fleet)

    elapsed, stored = run(pa.settings, scenario)
    assert_cancelled_everywhere(elapsed, stored, started, redis_client, keys)


def test_gates_permission_policy_pre_hooks_and_raised_failures(pa: AgentFleet) -> None:
    session = Session()
    session.gate(lambda invocation: invocation.function != "whoami")
    policy = PermissionPolicy(deny={"echo": ["rm*"]}, action_arg="value")
    seen: list[str] = []
    model, _ = turns(
        [
            ("whoami", {}, "g1"),
            ("echo", {"value": "rm -rf /"}, "g2"),
            ("echo", {"value": "ls"}, "g3"),
        ],
        "done",
    )

    async def scenario(fleet: Fleet) -> list[ToolReturnPart]:
        toolset = FleetToolset(["whoami", "echo"], fleet=fleet, session=session)
        toolset.hooks.on(HookPoint.TOOL_PRE, lambda p: seen.append(p["tool_name"]))
        toolset.hooks.on(HookPoint.TOOL_PRE, policy.pre_hook())
        result = await Agent(FunctionModel(model), toolsets=[toolset]).run("go")
        return returns(result.all_messages())

    denied, refused, allowed = run(pa.settings, scenario)
    assert (denied.outcome, denied.content) == ("denied", "denied by governance gate")
    assert refused.outcome == "failed"
    assert str(refused.content).startswith("PermissionError: permission denied")
    assert (allowed.outcome, allowed.content) == ("success", "ls")
    assert seen == ["echo", "echo"]  # the denied call never reached TOOL_PRE

    # By default a tool's exception ends the run as a local tool's does: its own type.
    failing, _ = turns([("fail", {"message": "stop here"}, "f1")], "never")

    async def raising(fleet: Fleet) -> None:
        toolset = FleetToolset(["fail"], fleet=fleet)
        await Agent(FunctionModel(failing), toolsets=[toolset]).run("go")

    with pytest.raises(ValueError) as raised:
        run(pa.settings, raising)
    assert type(raised.value) is ValueError and str(raised.value) == "stop here"


def test_the_documented_glue_runs_as_printed(pa: AgentFleet) -> None:
    """docs/agent-ecosystem.md's Pydantic AI lines, run with a scripted model."""
    glue = documented_glue("pydantic_ai")
    script, seen = turns([("add", {"a": 4, "b": 5}, "d1")], "9")

    async def scenario(fleet: Fleet) -> Any:
        space: dict[str, Any] = {"fleet": fleet, "model": FunctionModel(script), "Agent": Agent}
        exec(glue, space)
        return await space["agent"].run("4+5?")

    result = run(pa.settings, scenario)
    assert result.output == "9"
    [answer] = returns(result.all_messages())
    assert (answer.tool_call_id, answer.content) == ("d1", 9)
    assert isinstance(seen[0][0], ModelRequest)
    assert isinstance(seen[0][0].parts[0], UserPromptPart)
