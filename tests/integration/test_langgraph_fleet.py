"""LangGraph on the fleet: ``FleetToolNode`` in a compiled ``StateGraph`` (with
``tools_condition``) runs each AIMessage's tool calls on real workers as one batch, answers
with ToolMessages paired by the model's ids, and keeps toolfleet's guarantees: input order,
failures as error results, a replayed turn not run again (C7), cancellation reaching the
workers (C9), gates and TOOL_PRE hooks. The chat model is scripted (no network).
"""

from __future__ import annotations

import asyncio
import json
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langchain_core.tools import tool as langchain_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from langgraph.prebuilt.tool_node import TOOL_CALL_ERROR_TEMPLATE

from tests.support import sample_tools
from tests.support.agent_fleet import (
    AgentFleet,
    agent_fleet,
    assert_cancelled_everywhere,
    cancel_once_running,
    documented_glue,
)
from tests.support.fleet import run
from tests.support.langgraph_support import ScriptedChatModel, agent_loop, calls
from toolfleet import Branch, Fleet, HookPoint, PermissionPolicy, Session
from toolfleet.adapters.langgraph import FleetToolNode
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings


@pytest.fixture(scope="module")
def lg(fleet_settings: Settings, redis_url: str) -> Iterator[AgentFleet]:
    with agent_fleet(fleet_settings, redis_url, "langgraph") as fleet:
        yield fleet


def agent_graph(model: Any, node: ToolNode) -> Any:
    """The classic loop: agent → tools_condition → tools → agent."""
    return agent_loop(model, node)


def thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:8]}"}}


def test_a_graph_runs_each_turns_parallel_calls_on_the_fleet_as_one_batch(lg: AgentFleet) -> None:
    model = ScriptedChatModel(
        replies=[
            calls(
                ("whoami", {}, "call_who"),
                ("sleep_async", {"seconds": 0.3}, "call_sleep"),
                ("add", {"a": 2, "b": 3}, "call_add"),
                ("fail", {"message": "broken on purpose"}, "call_fail"),
                ("add", {"a": "two", "b": 3}, "call_bad"),
                ("not_a_tool", {}, "call_none"),
            ),
            calls(("city_weather", {"city": "Paris"}, "call_city")),
            AIMessage("done"),
        ]
    )
    config = thread()

    async def scenario(fleet: Fleet) -> tuple[dict[str, Any], FleetToolNode, Branch]:
        node = FleetToolNode(
            ["whoami", "sleep_async", "add", "fail", sample_tools.echo, "city_weather"],
            fleet=fleet,
            handle_tool_errors=True,
            toolfleet_metadata=True,
        )
        graph = agent_graph(model.bind_tools(node.tools), node)
        out = await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
        branch_id = node.branch_id(config["configurable"]["thread_id"])
        assert branch_id is not None
        return out, node, await Branch.load(branch_id, fleet=fleet)

    out, node, stored = run(lg.settings, scenario)

    messages = out["messages"]
    assert messages[-1].content == "done"
    answers = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in answers] == [
        "call_who",
        "call_sleep",
        "call_add",
        "call_fail",
        "call_bad",
        "call_none",
        "call_city",
    ]
    assert [m.name for m in answers[:4]] == ["whoami", "sleep_async", "add", "fail"]
    assert [m.status for m in answers] == ["success"] * 3 + ["error"] * 3 + ["success"]
    assert lg.runs_in_a_worker(json.loads(str(answers[0].content))["pid"])
    assert lg.runs_in_a_worker(json.loads(str(answers[6].content))["pid"])
    # add(a: float, b: float): LangChain's validation makes 2 a float, as for a local tool.
    assert answers[1].content == "0.3" and answers[2].content == "5.0"
    # ToolNode's texts: the tool's exception as its type, LangChain's validation error.
    assert answers[3].content == TOOL_CALL_ERROR_TEMPLATE.format(
        error=repr(ValueError("broken on purpose"))
    )
    assert str(answers[4].content).startswith("Error: ToolInvocationError(")
    assert "Error invoking tool 'add' with kwargs {'a': 'two', 'b': 3}" in str(answers[4].content)
    assert "not_a_tool is not a valid tool" in str(answers[5].content)
    assert answers[2].response_metadata["toolfleet"]["status"] == "completed"
    # Four calls of the first turn in one batch (the unknown tool and the call with bad
    # arguments never sent), then one.
    assert list(node.batcher.batch_sizes) == [4, 1]
    # The model was shown toolfleet's specs; the echo function became its fleet tool.
    assert {t["function"]["name"] for t in model.bound} == {
        "whoami",
        "sleep_async",
        "add",
        "fail",
        "echo",
        "city_weather",
    }
    add_spec = next(t for t in model.bound if t["function"]["name"] == "add")
    assert add_spec["function"]["parameters"]["required"] == ["a", "b"]
    # toolfleet's history of the thread, in the model's order, under the model's ids.
    requests = stored.messages[::2]
    assert [m.content.tool_call_id for m in requests] == [
        m.tool_call_id for m in answers if m.tool_call_id not in ("call_bad", "call_none")
    ]


def test_toolnode_shapes_in_and_out_and_invoke_without_a_loop(lg: AgentFleet) -> None:
    turn = calls(("add", {"a": 1, "b": 2}, "c1"), ("echo", {"value": {"k": "é"}}, "c2"))
    fleet = Fleet(lg.settings)
    try:
        node = FleetToolNode(["add", "echo"], fleet=fleet)
        # graph.invoke / node.invoke: the batch runs with act_sync, no event loop needed.
        as_list = node.invoke([HumanMessage("go"), turn])
        as_dict = node.invoke({"messages": [turn]})
        direct = node.invoke([{**c, "type": "tool_call"} for c in turn.tool_calls])
        with pytest.raises(ValueError, match="No AIMessage"):
            node.invoke([HumanMessage("hi")])
    finally:
        fleet.close()
    assert isinstance(as_list, list) and isinstance(as_dict, dict)
    # Each AIMessage's two calls, run from ToolNode's threads, went as one act_sync.
    assert list(node.batcher.batch_sizes) == [2, 2, 2]
    for answers in (as_list, as_dict["messages"], direct["messages"]):
        assert [(m.tool_call_id, m.content) for m in answers] == [
            ("c1", "3.0"),
            ("c2", '{"k": "é"}'),
        ]


def test_create_react_agents_per_call_sends_are_one_batch(lg: AgentFleet) -> None:
    """create_react_agent (v2) sends each tool call to the node on its own (``Send``); under
    ainvoke the calls of one superstep in one thread still make one batch."""
    model = ScriptedChatModel(
        replies=[
            calls(("whoami", {}, "r1"), ("add", {"a": 1, "b": 2}, "r2"), ("echo", {}, "r3")),
            AIMessage("done"),
        ]
    )

    async def scenario(fleet: Fleet) -> tuple[dict[str, Any], FleetToolNode]:
        node = FleetToolNode(["whoami", "add", "echo"], fleet=fleet)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # create_react_agent moved to langchain.agents
            agent = create_react_agent(model, node)
        return await agent.ainvoke({"messages": [HumanMessage("go")]}, thread()), node

    out, node = run(lg.settings, scenario)
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.status) for m in answers] == [
        ("r1", "success"),
        ("r2", "success"),
        ("r3", "success"),
    ]
    assert lg.runs_in_a_worker(json.loads(str(answers[0].content))["pid"])
    assert list(node.batcher.batch_sizes) == [3]
    assert {t["function"]["name"] for t in model.bound} == {"whoami", "add", "echo"}


def test_langchain_tools_over_fleet_tools_and_unknown_names(lg: AgentFleet) -> None:
    fleet = Fleet(lg.settings)
    try:
        # A LangChain tool over the toolfleet function: the model sees LangChain's schema,
        # the workers run the call.
        wrapped = StructuredTool.from_function(sample_tools.whoami, description="Who runs it.")
        node = FleetToolNode([wrapped], fleet=fleet)
        assert node.tools == [wrapped]
        [answer] = node.invoke([calls(("whoami", {}, "w1"))])
        assert lg.runs_in_a_worker(json.loads(answer.content)["pid"])
        with pytest.raises(ConfigurationError, match="not a tool of this fleet"):
            FleetToolNode(["no_such_tool"], fleet=fleet)

        @langchain_tool
        def local_only(x: int) -> int:
            """Not a fleet tool."""
            return x

        with pytest.raises(ConfigurationError, match="local_only"):
            FleetToolNode([local_only], fleet=fleet)
        # A generated tool invoked on its own runs one call on the fleet.
        [add] = FleetToolNode(["add"], fleet=fleet).tools
        assert add.invoke({"a": 1, "b": 1}) == 2
    finally:
        fleet.close()


def test_a_replayed_turn_in_the_same_thread_does_not_run_its_tools_again(
    lg: AgentFleet, tmp_path: Path
) -> None:
    """C7: the thread's branch derives call ids from the model's ids, so answering the same
    AIMessage again (a resumed checkpoint) is served from the workers' records."""
    path = tmp_path / "effects.txt"
    turn = calls(
        ("append_line", {"path": str(path), "text": "once"}, "call_effect"),
        ("whoami", {}, "call_who"),
    )
    config = thread()

    async def scenario(fleet: Fleet) -> tuple[list[Any], list[Any], list[Any]]:
        node = FleetToolNode(["append_line", "whoami"], fleet=fleet)
        first = (await node.ainvoke({"messages": [turn]}, config))["messages"]
        again = (await FleetToolNode(fleet=fleet).ainvoke({"messages": [turn]}, config))["messages"]
        other = (await node.ainvoke({"messages": [turn]}, thread()))["messages"]
        return first, again, other

    first, again, other = run(lg.settings, scenario)
    assert [m.content for m in again] == [m.content for m in first]
    assert [m.tool_call_id for m in again] == ["call_effect", "call_who"]
    # Run once in the thread; another thread is another conversation and runs it again.
    assert first[0].content == "1" and other[0].content == "2"
    assert path.read_text().splitlines() == ["once", "once"]


def test_cancelling_the_graph_run_cancels_the_calls_on_the_workers(
    lg: AgentFleet, redis_client: redis.Redis
) -> None:
    """C9: cancelling the task awaiting graph.ainvoke cancels the act(): the running async
    calls are cancelled on their worker and every call is recorded CANCELLED."""
    keys = Keys(lg.settings.key_prefix)
    model = ScriptedChatModel(
        replies=[
            calls(
                ("sleep_async", {"seconds": 30}, "long_1"),
                ("sleep_async", {"seconds": 30}, "long_2"),
            ),
            AIMessage("never"),
        ]
    )
    config = thread()
    started: list[str] = []

    async def scenario(fleet: Fleet) -> tuple[float, Branch]:
        node = FleetToolNode(["sleep_async"], fleet=fleet)
        node.hooks.on(HookPoint.TOOL_PRE, lambda p: started.append(p["call_id"]))
        graph = agent_graph(model, node)
        task = asyncio.ensure_future(graph.ainvoke({"messages": [HumanMessage("go")]}, config))
        elapsed = await cancel_once_running(task, started, redis_client, keys)
        branch_id = node.branch_id(config["configurable"]["thread_id"])
        assert branch_id is not None
        return elapsed, await Branch.load(branch_id, fleet=fleet)

    elapsed, stored = run(lg.settings, scenario)
    assert_cancelled_everywhere(elapsed, stored, started, redis_client, keys)


def test_gates_permission_policy_and_pre_hooks_apply(lg: AgentFleet) -> None:
    session = Session()
    session.gate(lambda invocation: invocation.function != "whoami")
    policy = PermissionPolicy(deny={"echo": ["rm*"]}, action_arg="value")
    seen: list[str] = []
    turn = calls(
        ("whoami", {}, "g1"),
        ("echo", {"value": "rm -rf /"}, "g2"),
        ("echo", {"value": "ls"}, "g3"),
    )

    async def scenario(fleet: Fleet) -> list[Any]:
        node = FleetToolNode(
            ["whoami", "echo"], fleet=fleet, session=session, handle_tool_errors=True
        )
        node.hooks.on(HookPoint.TOOL_PRE, lambda p: seen.append(p["tool_name"]))
        node.hooks.on(HookPoint.TOOL_PRE, policy.pre_hook())
        return list(await node.ainvoke([turn], thread()))

    denied, refused, allowed = run(lg.settings, scenario)
    # Refused calls fail as a tool raising PermissionError would, in ToolNode's template.
    assert (denied.status, denied.content) == (
        "error",
        TOOL_CALL_ERROR_TEMPLATE.format(error=repr(PermissionError("denied by governance gate"))),
    )
    assert refused.status == "error"
    assert str(refused.content).startswith('Error: PermissionError("permission denied: echo')
    assert (allowed.status, allowed.content) == ("success", "ls")
    assert seen == ["echo", "echo"]  # the denied call never reached TOOL_PRE

    # branch= puts every call on that branch, under its hooks.
    async def on_branch(fleet: Fleet) -> Branch:
        branch = Branch(fleet=fleet)
        node = FleetToolNode(["echo"], branch=branch, handle_tool_errors=True)
        policy.install(branch)
        await node.ainvoke([calls(("echo", {"value": "rm x"}, "b1"))], thread())
        return branch

    branch = run(lg.settings, on_branch)
    assert str(branch.messages[1].content.error).startswith("PermissionError")


def test_the_documented_glue_runs_as_printed(lg: AgentFleet) -> None:
    """docs/agent-ecosystem.md's LangGraph lines, run with a graph builder and a model."""
    glue = documented_glue("langgraph")

    async def scenario(fleet: Fleet) -> dict[str, Any]:
        model = ScriptedChatModel(replies=[calls(("add", {"a": 4, "b": 5}, "d1")), AIMessage("9")])
        builder = StateGraph(MessagesState)
        space: dict[str, Any] = {"fleet": fleet, "builder": builder, "model": model}
        exec(glue, space)
        bound = space["model"]

        async def agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await bound.ainvoke(state["messages"])]}

        builder.add_node("agent", agent)
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        assert "add" in {t["function"]["name"] for t in model.bound}
        return await builder.compile().ainvoke({"messages": [HumanMessage("4+5?")]}, thread())

    out = run(lg.settings, scenario)
    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert (answer.tool_call_id, answer.content) == ("d1", "9.0")
