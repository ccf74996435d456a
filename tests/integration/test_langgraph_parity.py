"""Parity with ToolNode: the same LangChain tools, the same turn, once in ``ToolNode`` (run
here) and once in ``FleetToolNode`` (run on real workers), under every form of
``handle_tool_errors`` — the same ToolMessages (equal, field for field) or the same exception
raised, with the tool's own ``handle_tool_error`` respected as ToolNode does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph._internal._constants import CONFIG_KEY_RUNTIME
from langgraph.prebuilt import ToolNode
from langgraph.runtime import Runtime

from tests.support import langgraph_tools, sample_tools
from tests.support.agent_fleet import TOOLS, AgentFleet, agent_fleet
from tests.support.fleet import run
from tests.support.langgraph_support import calls
from toolfleet import Fleet
from toolfleet.adapters.langgraph import FleetToolNode
from toolfleet.schemas.settings import Settings


@pytest.fixture(scope="module")
def lg(fleet_settings: Settings, redis_url: str) -> Iterator[AgentFleet]:
    tools = (*TOOLS, "tests.support.langgraph_tools")
    with agent_fleet(fleet_settings, redis_url, "langgraph-parity", tools) as fleet:
        yield fleet


def langchain_tools() -> list[BaseTool]:
    """LangChain tools over the fleet's functions; ``buy`` has its own handle_tool_error."""
    return [
        StructuredTool.from_function(sample_tools.add, description="Add two numbers."),
        StructuredTool.from_function(sample_tools.fail, description="Raise ValueError."),
        StructuredTool.from_function(
            langgraph_tools.buy, handle_tool_error="The shop says: try another item."
        ),
    ]


TURN = calls(
    ("add", {"a": 1, "b": 2}, "ok"),
    ("buy", {"item": "gold"}, "sold_out"),  # ToolException: the tool's own handler
    ("add", {"a": "one", "b": 2}, "bad_args"),  # LangChain's validation: ToolInvocationError
    ("no_such_tool", {}, "unknown"),
    ("fail", {"message": "broken on purpose"}, "value_error"),  # ValueError
    ("buy", {"item": "lead"}, "out_of_stock"),  # OutOfStock, an application's class
)
# For the handlers typed for one exception: no argument error to raise first.
TYPED_TURN = calls(
    ("add", {"a": 1, "b": 2}, "ok"),
    ("fail", {"message": "broken on purpose"}, "value_error"),
    ("buy", {"item": "lead"}, "out_of_stock"),
)


def on_value_error(e: ValueError) -> str:
    return f"value trouble: {e}"


def on_shop_error(e: langgraph_tools.OutOfStock) -> str:
    return f"shop trouble: {e}"


def on_anything(e):  # type: ignore[no-untyped-def]  # untyped: ToolNode handles every type
    return f"{type(e).__name__}!"


DEFAULT = object()
FORMS: list[Any] = [
    DEFAULT,  # ToolNode's default: only bad arguments become messages, ValueError raises
    True,
    False,
    "Something went wrong.",
    on_anything,
    (ValueError, langgraph_tools.OutOfStock),
    (TypeError,),
    ValueError,
    on_value_error,  # handles ValueError only: OutOfStock raises
    on_shop_error,  # rebuilt by type: handles OutOfStock only, ValueError raises
]


def turn_for(form: Any) -> Any:
    return TYPED_TURN if form in (on_value_error, on_shop_error) else TURN


def local_outcome(tools: list[BaseTool], form: Any) -> Any:
    """The messages ToolNode answers to the form's turn, or the type and text it raised."""
    config: Any = {"configurable": {CONFIG_KEY_RUNTIME: Runtime()}}
    try:
        return ToolNode(tools, **options(form)).invoke({"messages": [turn_for(form)]}, config)[
            "messages"
        ]
    except Exception as exc:
        return (type(exc), str(exc))


def options(form: Any) -> dict[str, Any]:
    return {} if form is DEFAULT else {"handle_tool_errors": form}


def test_every_form_of_handle_tool_errors_gives_what_toolnode_gives(lg: AgentFleet) -> None:
    tools = langchain_tools()
    expected = [local_outcome(tools, form) for form in FORMS]

    async def scenario(fleet: Fleet) -> list[Any]:
        answers = []
        for form in FORMS:
            node = FleetToolNode(tools, fleet=fleet, **options(form))
            try:
                answers.append((await node.ainvoke({"messages": [turn_for(form)]}))["messages"])
            except Exception as exc:
                answers.append((type(exc), str(exc)))
        return answers

    answers = run(lg.settings, scenario)
    for form, got, want in zip(FORMS, answers, expected, strict=True):
        assert got == want, form
    # The forms took the paths this test means to cover.
    [default, handled, *_] = expected
    assert default[0] is ValueError
    assert [m.status for m in handled] == ["success"] + ["error"] * 5
    assert handled[1].content == "The shop says: try another item."
    assert expected[-2][0] is langgraph_tools.OutOfStock and expected[-1][0] is ValueError
    # graph.invoke's path (each call an act_sync of its own) answers alike.
    fleet_sync = Fleet(lg.settings)
    try:
        node = FleetToolNode(tools, fleet=fleet_sync, handle_tool_errors=True)
        assert node.invoke({"messages": [TURN]})["messages"] == handled
    finally:
        fleet_sync.close()


def test_messages_compare_equal_and_toolfleet_ids_are_opt_in(lg: AgentFleet) -> None:
    turn = calls(("add", {"a": 1, "b": 2}, "m1"), ("fail", {"message": "no"}, "m2"))
    tools = langchain_tools()

    async def scenario(fleet: Fleet) -> tuple[list[ToolMessage], list[ToolMessage]]:
        plain = FleetToolNode(tools, fleet=fleet, handle_tool_errors=True)
        labelled = FleetToolNode(
            tools, fleet=fleet, handle_tool_errors=True, toolfleet_metadata=True
        )
        return (
            (await plain.ainvoke({"messages": [turn]}))["messages"],
            (await labelled.ainvoke({"messages": [turn]}))["messages"],
        )

    plain, labelled = run(lg.settings, scenario)
    assert all(m.response_metadata == {} for m in plain)
    assert [m.response_metadata["toolfleet"]["status"] for m in labelled] == [
        "completed",
        "failed",
    ]
    assert all(m.response_metadata["toolfleet"]["call_id"] for m in labelled)
