"""LangGraph's features on the fleet, each against ToolNode running the same tools locally:
tools returning a ``Command`` (a state update and a ``goto``) or a list of ``Command`` and
``ToolMessage``. Real workers, a scripted model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from tests.support import langgraph_tools
from tests.support.agent_fleet import TOOLS, AgentFleet, agent_fleet
from tests.support.fleet import run
from tests.support.langgraph_support import ScriptedChatModel, calls
from toolfleet import Fleet
from toolfleet.adapters.langgraph import FleetToolNode
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
