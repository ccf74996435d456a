"""Pydantic AI parity: the same scripted model runs once against a local ``FunctionToolset`` of
the functions and once against a ``FleetToolset`` of the same functions on real workers; the
model must read the same thing, and the run must end the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai import Tool as LocalTool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from tests.integration.test_pydantic_ai_fleet import returns, turns
from tests.support import agent_tools, pydantic_ai_tools, sample_tools
from tests.support.agent_fleet import AgentFleet, agent_fleet
from tests.support.fleet import run
from toolfleet import Fleet
from toolfleet.adapters.pydantic_ai import FleetToolset
from toolfleet.schemas.settings import Settings


@pytest.fixture(scope="module")
def pa(fleet_settings: Settings, redis_url: str) -> Iterator[AgentFleet]:
    more = ("tests.support.pydantic_ai_tools",)
    with agent_fleet(fleet_settings, redis_url, "pydantic-ai-parity", more_tools=more) as fleet:
        yield fleet


Calls = list[tuple[str, dict[str, Any], str]]
Toolset = Callable[[Fleet], AbstractToolset[Any]]


def read(pa: AgentFleet, calls: Calls, toolset: Toolset) -> list[tuple[Any, ...]]:
    """What the model read, per call: (id, outcome, content)."""
    model, _ = turns(calls, "done")

    async def scenario(fleet: Fleet) -> list[tuple[Any, ...]]:
        agent = Agent(FunctionModel(model), toolsets=[toolset(fleet)], retries=2)
        result = await agent.run("go")
        return [(p.tool_call_id, p.outcome, p.content) for p in returns(result.all_messages())]

    return run(pa.settings, scenario)


def raised(pa: AgentFleet, calls: Calls, toolset: Toolset) -> BaseException:
    """The exception the run ended with."""
    with pytest.raises(Exception) as ended:
        read(pa, calls, toolset)
    return ended.value


def test_retries_failures_returned_models_and_timeouts_read_as_a_local_tools(
    pa: AgentFleet,
) -> None:
    calls: Calls = [
        ("city_weather", {"city": "paris"}, "p1"),
        ("closed_shop", {"item": "milk"}, "p2"),
        ("forecast", {"city": "Oslo"}, "p3"),
        ("slow_lookup", {"key": "k"}, "p4"),
    ]
    local = [
        LocalTool(agent_tools.city_weather),
        LocalTool(agent_tools.closed_shop),
        LocalTool(pydantic_ai_tools.forecast),
        LocalTool(pydantic_ai_tools.slow_lookup, timeout=0.3),
    ]
    names = [t.name for t in local]
    here = read(pa, calls, lambda _: FunctionToolset(local))
    on_fleet = read(pa, calls, lambda fleet: FleetToolset(names, fleet=fleet))
    assert on_fleet == here
    assert [outcome for _, outcome, _ in on_fleet] == ["retried", "failed", "success", "retried"]
    # A returned pydantic model is the model, not its JSON.
    assert on_fleet[2][2] == pydantic_ai_tools.Forecast(city="Oslo", sky="clear")
    assert on_fleet[3][2] == "Timed out after 0.3 seconds."


def test_a_tools_exception_ends_the_run_with_its_own_type_and_a_retry_is_known_by_type(
    pa: AgentFleet,
) -> None:
    """A local tool's exception propagates out of the run; so does a fleet tool's, rebuilt
    as its class. An exception only named ModelRetry is not a retry."""
    for function in (sample_tools.fail, pydantic_ai_tools.impostor_retry):
        calls: Calls = [(function.__name__, {"message": "no"}, "e1")]
        local = FunctionToolset([LocalTool(function)])
        here = raised(pa, calls, lambda _, toolset=local: toolset)  # type: ignore[misc]
        name = function.__name__
        on_fleet = raised(pa, calls, lambda fleet, n=name: FleetToolset([n], fleet=fleet))  # type: ignore[misc]
        assert type(on_fleet) is type(here)
        assert str(on_fleet) == str(here) == "no"
    assert type(on_fleet).__qualname__ == "Impostors.ModelRetry"

    # tool_errors_as_results: the option that makes it a failed result the model reads (C1).
    calls = [("impostor_retry", {"message": "no"}, "e2")]
    as_results = read(
        pa,
        calls,
        lambda fleet: FleetToolset(["impostor_retry"], fleet=fleet, tool_errors_as_results=True),
    )
    assert as_results == [("e2", "failed", "ModelRetry: no")]


def test_the_toolset_wrappers_apply_to_fleet_tools_as_to_local_ones(pa: AgentFleet) -> None:
    """Prefixing, renaming, filtering, preparing and approval_required wrap a FleetToolset as
    any leaf toolset: the model sees their names and descriptions, calls run on the fleet."""
    offered: list[dict[str, str | None]] = []
    calls: Calls = [
        ("fleet_add", {"a": 1, "b": 2}, "w1"),
        ("fleet_plus", {"value": "hi"}, "w2"),
        ("fleet_add", {"a": 6, "b": 13}, "w3"),
    ]

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if offered:
            return ModelResponse(parts=[TextPart("done")])
        offered.append({t.name: t.description for t in info.function_tools})
        return ModelResponse(parts=[ToolCallPart(n, a, tool_call_id=i) for n, a, i in calls])

    async def scenario(fleet: Fleet) -> Any:
        base = FleetToolset(["add", "whoami", "echo"], fleet=fleet)
        wrapped = (
            base.filtered(lambda ctx, definition: definition.name != "whoami")
            .renamed({"plus": "echo"})
            .prepared(lambda ctx, defs: [replace(d, description=f"[fleet] {d.name}") for d in defs])
            .approval_required(lambda ctx, definition, args: args.get("b") == 13)
            .prefixed("fleet")
        )
        agent = Agent(
            FunctionModel(model), toolsets=[wrapped], output_type=[str, DeferredToolRequests]
        )
        return await agent.run("go")

    result = run(pa.settings, scenario)
    assert offered == [
        {"fleet_add": "[fleet] add", "fleet_plus": "[fleet] plus"},
    ]
    added, echoed = returns(result.all_messages())
    assert (added.tool_call_id, added.content) == ("w1", 3)
    assert (echoed.tool_call_id, echoed.content) == ("w2", "hi")
    assert isinstance(result.output, DeferredToolRequests)
    assert [c.tool_call_id for c in result.output.approvals] == ["w3"]
