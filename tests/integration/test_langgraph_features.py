"""LangGraph's features on the fleet, each against ToolNode running the same tools locally:
tools returning a ``Command`` (a state update and a ``goto``) or a list of ``Command`` and
``ToolMessage``; ``wrap_tool_call`` / ``awrap_tool_call`` interceptors; and the injected values
that cannot reach a worker, refused in one line (``interrupt()``: test_langgraph_interrupt.py).
Real workers, a scripted model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langgraph._internal._constants import CONFIG_KEY_RUNTIME
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.runtime import Runtime

from tests.support import langgraph_tools, sample_tools
from tests.support.agent_fleet import TOOLS, AgentFleet, agent_fleet
from tests.support.fleet import run
from tests.support.langgraph_support import ScriptedChatModel, agent_loop, calls
from toolfleet import Fleet
from toolfleet.adapters.langgraph import FleetToolNode
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import Settings


@pytest.fixture(scope="module")
def lg(fleet_settings: Settings, redis_url: str) -> Iterator[AgentFleet]:
    tools = (*TOOLS, "tests.support.langgraph_tools")
    with agent_fleet(fleet_settings, redis_url, "langgraph-features", tools) as fleet:
        yield fleet


class MoodState(MessagesState):
    mood: str


def mood_run(node_for: Any) -> tuple[dict[str, Any], list[str]]:
    """A graph whose tools set the mood: set_mood (a Command with goto "after"), then
    mood_steps (a Command and a ToolMessage); its final state and the nodes "after" saw."""
    model = ScriptedChatModel(
        replies=[
            calls(("set_mood", {"mood": "calm"}, "m1")),
            calls(("mood_steps", {}, "m2")),
            AIMessage("done"),
        ]
    )
    after: list[str] = []

    def agent(state: MoodState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def after_node(state: MoodState) -> dict[str, Any]:
        after.append(state["mood"])
        return {}

    tools = [
        StructuredTool.from_function(langgraph_tools.set_mood),
        StructuredTool.from_function(langgraph_tools.mood_steps),
    ]
    builder = StateGraph(MoodState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node_for(tools))
    builder.add_node("after", after_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    builder.add_edge("after", END)
    return builder.compile(), after  # type: ignore[return-value]


def plain(state: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    return [
        (m.type, m.content, getattr(m, "tool_call_id", None), getattr(m, "name", None))
        for m in state["messages"]
    ]


def test_tools_returning_commands_and_lists_update_the_graph_as_under_toolnode(
    lg: AgentFleet,
) -> None:
    local_graph, local_after = mood_run(ToolNode)
    local = local_graph.invoke({"messages": [HumanMessage("go")], "mood": "none"})

    async def scenario(fleet: Fleet) -> tuple[dict[str, Any], list[str]]:
        graph, after = mood_run(lambda tools: FleetToolNode(tools, fleet=fleet))
        return await graph.ainvoke({"messages": [HumanMessage("go")], "mood": "none"}), after

    fleet_state, fleet_after = run(lg.settings, scenario)
    assert fleet_state["mood"] == local["mood"] == "busy"
    assert fleet_after == local_after == ["calm"]  # goto "after" ran, with the updated mood
    assert plain(fleet_state) == plain(local)
    assert ("tool", "mood is calm", "m1", "set_mood") in plain(fleet_state)
    assert ("tool", "two steps", "m2", None) in plain(fleet_state)  # ToolNode names it not


def shop_interceptor(request: Any, execute: Any) -> Any:
    """Short-circuits "gold", buys "iron" instead of "lead", retries a failure once."""
    call = request.tool_call
    if call["args"].get("item") == "gold":
        return ToolMessage("gold is never sold here", tool_call_id=call["id"], name=call["name"])
    if call["args"].get("item") == "lead":
        request = request.override(tool_call={**call, "args": {"item": "iron"}})
    first = execute(request)
    if getattr(first, "status", None) == "error":
        return execute(request.override(tool_call={**call, "args": {"item": "tin"}}))
    return first


async def async_shop_interceptor(request: Any, execute: Any) -> Any:
    call = request.tool_call
    if call["args"].get("item") == "gold":
        return ToolMessage("gold is never sold here", tool_call_id=call["id"], name=call["name"])
    if call["args"].get("item") == "lead":
        request = request.override(tool_call={**call, "args": {"item": "iron"}})
    first = await execute(request)
    if getattr(first, "status", None) == "error":
        return await execute(request.override(tool_call={**call, "args": {"item": "tin"}}))
    return first


def test_wrap_tool_call_interceptors_run_as_under_toolnode(lg: AgentFleet) -> None:
    """Interceptors see each call and may change it, answer it themselves, or run it again;
    a call one holds back does not hold up the others' batch."""
    turn = calls(
        ("buy", {"item": "gold"}, "w1"),  # answered by the interceptor: never sent
        ("buy", {"item": "lead"}, "w2"),  # changed to iron
        ("fail", {"message": "first try"}, "w3"),  # fails, runs again, fails again
        ("buy", {"item": "salt"}, "w4"),
    )
    tools = [
        StructuredTool.from_function(langgraph_tools.buy),
        StructuredTool.from_function(sample_tools.fail, description="Raise ValueError."),
    ]
    config: Any = {"configurable": {CONFIG_KEY_RUNTIME: Runtime()}}
    options: dict[str, Any] = {"handle_tool_errors": True, "wrap_tool_call": shop_interceptor}
    local = ToolNode(tools, **options).invoke({"messages": [turn]}, config)["messages"]

    async def scenario(fleet: Fleet) -> tuple[list[Any], list[Any], list[int]]:
        sync_wrapped = FleetToolNode(tools, fleet=fleet, **options)
        async_wrapped = FleetToolNode(
            tools, fleet=fleet, handle_tool_errors=True, awrap_tool_call=async_shop_interceptor
        )
        return (
            (await sync_wrapped.ainvoke({"messages": [turn]}))["messages"],
            (await async_wrapped.ainvoke({"messages": [turn]}))["messages"],
            list(async_wrapped.batcher.batch_sizes),
        )

    with_sync, with_async, sizes = run(lg.settings, scenario)
    assert with_sync == local and with_async == local
    assert [m.content for m in local[:2]] == ["gold is never sold here", "bought iron"]
    assert local[2].status == "error" and local[3].content == "bought salt"
    # The first tries of three calls went as one batch; the retry of "fail" as another.
    assert sizes == [3, 1]


def test_injected_values_that_cannot_reach_a_worker_are_refused(lg: AgentFleet) -> None:
    fleet = Fleet(lg.settings)
    try:
        for tool, what in (
            (langgraph_tools.remember_in_store, "'store' is InjectedStore"),
            (langgraph_tools.run_info, "'runtime' is ToolRuntime"),
        ):
            refusal = f"tool '{tool.__name__}': parameter {what}"
            with pytest.raises(ConfigurationError, match=refusal):
                FleetToolNode([tool], fleet=fleet)
        node = FleetToolNode([langgraph_tools.count_messages], fleet=fleet)
        turn = calls(("count_messages", {}, "c1"))
        with pytest.raises(ConfigurationError) as refused:
            node.invoke({"messages": [turn]})
        assert str(refused.value).startswith(
            "tool 'count_messages': the value LangGraph injects for parameter 'messages' is a "
            "list, not JSON"
        )
    finally:
        fleet.close()


def test_what_cannot_come_back_from_a_worker_fails_in_words(lg: AgentFleet) -> None:
    """A Command with a Send in goto has no JSON form: it fails, saying so, instead of an
    output mangled without a word."""
    turn = calls(("fan_out", {"nodes": ["a"]}, "s2"))

    async def scenario(fleet: Fleet) -> list[Any]:
        node = FleetToolNode(
            ["fan_out"], fleet=fleet, handle_tool_errors=lambda e: f"{type(e).__name__}: {e}"
        )
        return list((await node.ainvoke({"messages": [turn]}))["messages"])

    [fanned] = run(lg.settings, scenario)
    assert fanned.status == "error"
    assert str(fanned.content).startswith(
        "NoJSONOutputError: tool 'fan_out' returned a value with no JSON form"
    )


def stream_graph(node: ToolNode) -> Any:
    model = ScriptedChatModel(
        replies=[calls(("stream_rows", {"rows": 3, "pause_s": 0.15}, "r1")), AIMessage("done")]
    )
    return agent_loop(model, node)


def test_get_stream_writer_on_a_worker_writes_to_the_graphs_custom_stream(lg: AgentFleet) -> None:
    """A tool's writes travel as its call's progress reports (at most 10 a second, the latest
    kept: these are 0.15 s apart, so all arrive) and reach the custom stream in order."""
    tools = [StructuredTool.from_function(langgraph_tools.stream_rows)]
    local = list(stream_graph(ToolNode(tools)).stream({"messages": []}, stream_mode="custom"))

    async def scenario(fleet: Fleet) -> list[Any]:
        graph = stream_graph(FleetToolNode(tools, fleet=fleet))
        return [c async for c in graph.astream({"messages": []}, stream_mode="custom")]

    streamed = run(lg.settings, scenario)
    assert streamed == local == [{"row": 0}, {"row": 1}, {"row": 2}]
