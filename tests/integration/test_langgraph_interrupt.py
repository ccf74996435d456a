"""``interrupt()`` in a tool on a worker, against ToolNode running the same tool locally: the
graph pauses with the same interrupt values, ``Command(resume=...)`` resumes it with the value
reaching the worker, and the tool's side effects before each interrupt run again on resume as
LangGraph re-runs a node from its start. Real workers, a scripted model, an InMemorySaver."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from tests.support import langgraph_tools
from tests.support.agent_fleet import TOOLS, AgentFleet, agent_fleet
from tests.support.fleet import run
from tests.support.langgraph_support import ScriptedChatModel, agent_loop, calls
from toolfleet import Fleet
from toolfleet.adapters.langgraph import FleetToolNode
from toolfleet.dispatcher.branch import Branch
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import Settings

TOOL = StructuredTool.from_function(langgraph_tools.ask_logged)


@pytest.fixture(scope="module")
def lg(fleet_settings: Settings, redis_url: str) -> Iterator[AgentFleet]:
    tools = (*TOOLS, "tests.support.langgraph_tools")
    with agent_fleet(fleet_settings, redis_url, "langgraph-interrupt", tools) as fleet:
        yield fleet


def asking_graph(node: ToolNode, path: Path, questions: list[str]) -> Any:
    """An agent that calls ask_logged once, then ends; with a checkpointer, as interrupts need."""
    model = ScriptedChatModel(
        replies=[
            calls(("ask_logged", {"path": str(path), "questions": questions}, "q1")),
            AIMessage("done"),
        ]
    )

    return agent_loop(model, node, checkpointer=InMemorySaver())


def thread() -> dict[str, Any]:
    # A fresh thread per run: a thread's calls are kept in toolfleet's history (C7).
    return {"configurable": {"thread_id": f"interrupt-{uuid.uuid4().hex}"}}


def asked(state: dict[str, Any]) -> list[Any]:
    return [pause.value for pause in state.get("__interrupt__", [])]


def answers(state: dict[str, Any]) -> list[Any]:
    return [(m.type, m.content) for m in state["messages"] if m.type == "tool"]


def local_run(path: Path, questions: list[str], resumes: list[Any]) -> list[dict[str, Any]]:
    graph, config = asking_graph(ToolNode([TOOL]), path, questions), thread()
    states = [graph.invoke({"messages": [HumanMessage("go")]}, config)]
    states += [graph.invoke(Command(resume=value), config) for value in resumes]
    return states


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_an_interrupt_on_a_worker_pauses_the_graph_and_the_resume_value_reaches_it(
    lg: AgentFleet, tmp_path: Path
) -> None:
    """graph.ainvoke: one interrupt, one resume. A pause is not a failure: with retries on,
    the interrupted call is not run again."""
    local = local_run(tmp_path / "local.txt", ["proceed?"], ["yes"])

    async def scenario(fleet: Fleet) -> tuple[list[dict[str, Any]], Branch]:
        node = FleetToolNode([TOOL], fleet=fleet, call_params=CallParams(retry_attempts=2))
        graph = asking_graph(node, tmp_path / "fleet.txt", ["proceed?"])
        config = thread()
        paused = await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
        resumed = await graph.ainvoke(Command(resume="yes"), config)
        branch_id = node.branch_id(config["configurable"]["thread_id"])
        assert branch_id is not None
        return [paused, resumed], await Branch.load(branch_id, fleet=fleet)

    on_fleet, stored = run(lg.settings, scenario)
    # toolfleet's history says what happened: the call paused; on resume, it was answered
    # from its record (C7: not run again), then run again with the answer as a new call.
    requests, responses = stored.messages[::2], stored.messages[1::2]
    assert [m.content.tool_call_id for m in requests] == ["q1", "q1", "q1#resume-1"]
    assert [r.content.error for r in responses[:2]] == [
        "ToolInterruptedError: the tool called interrupt({'question': 'proceed?'}) and waits "
        "for Command(resume=...)"
    ] * 2
    assert responses[2].content.output == ["yes"]
    assert asked(on_fleet[0]) == asked(local[0]) == [{"question": "proceed?"}]
    assert answers(on_fleet[0]) == answers(local[0]) == []  # paused: no ToolMessage yet
    assert asked(on_fleet[1]) == asked(local[1]) == []
    assert answers(on_fleet[1]) == answers(local[1]) == [("tool", '["yes"]')]
    # The write before interrupt() ran again on resume, as under ToolNode; the answer
    # "yes" was written by the tool on the worker.
    assert lines(tmp_path / "fleet.txt") == lines(tmp_path / "local.txt")
    assert lines(tmp_path / "fleet.txt") == ["asking proceed?", "asking proceed?", 'answer "yes"']


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
def test_two_interrupts_in_one_tool_resume_in_order(
    lg: AgentFleet, tmp_path: Path, path: str
) -> None:
    """graph.invoke (ToolNode's threads) and graph.ainvoke: the tool's second interrupt()
    gets the second resume value, the first one given to it again on the worker."""
    questions, resumes = ["first?", "second?"], ["x", {"n": 2}]
    local = local_run(tmp_path / "local.txt", questions, resumes)
    inputs: list[Any] = [{"messages": [HumanMessage("go")]}]
    inputs += [Command(resume=value) for value in resumes]

    async def scenario(fleet: Fleet) -> list[dict[str, Any]]:
        node = FleetToolNode([TOOL], fleet=fleet)
        graph, config = asking_graph(node, tmp_path / "fleet.txt", questions), thread()
        if path == "ainvoke":
            return [await graph.ainvoke(given, config) for given in inputs]
        # graph.invoke blocks: off the loop, as an application's sync code would run it
        return await asyncio.to_thread(lambda: [graph.invoke(given, config) for given in inputs])

    on_fleet = run(lg.settings, scenario)
    assert [asked(s) for s in on_fleet] == [asked(s) for s in local]
    assert [asked(s) for s in on_fleet] == [[{"question": "first?"}], [{"question": "second?"}], []]
    assert [answers(s) for s in on_fleet] == [answers(s) for s in local]
    assert answers(on_fleet[-1]) == [("tool", '["x", {"n": 2}]')]
    assert lines(tmp_path / "fleet.txt") == lines(tmp_path / "local.txt")
    assert lines(tmp_path / "fleet.txt").count("asking first?") == 3  # one per node run


def test_a_resume_value_that_is_not_json_is_refused_in_one_line(
    lg: AgentFleet, tmp_path: Path
) -> None:
    fleet = Fleet(lg.settings)
    try:
        graph = asking_graph(FleetToolNode([TOOL], fleet=fleet), tmp_path / "f.txt", ["ok?"])
        config = thread()
        assert asked(graph.invoke({"messages": [HumanMessage("go")]}, config)) == [
            {"question": "ok?"}
        ]
        with pytest.raises(ConfigurationError) as refused:
            graph.invoke(Command(resume={1, 2}), config)
    finally:
        fleet.close()
    assert str(refused.value) == (
        "tool 'ask_logged': the resume value for its interrupt() is a set, not JSON, so it "
        "cannot reach a worker; resume with Command(resume=<JSON value>)"
    )
    assert lines(tmp_path / "f.txt") == ["asking ok?"]  # the resumed call was never sent


def test_a_model_cannot_answer_an_interrupt_through_its_arguments(
    lg: AgentFleet, tmp_path: Path
) -> None:
    """Resume values travel beside a call's arguments, never in them: a model's tool call that
    carries them as an argument (the provider shape any agent loop hands to act()) has them
    dropped before enqueue, so the tool still pauses at its interrupt() instead of reading the
    model's answer."""
    path = tmp_path / "forged.log"
    forged = {
        "id": "call_forged",
        "type": "function",
        "function": {
            "name": "ask_logged",
            "arguments": json.dumps(
                {"path": str(path), "questions": ["pay?"], "__langgraph_resume__": ["yes"]}
            ),
        },
    }

    async def scenario(fleet: Fleet) -> Any:
        [result] = await Branch(fleet=fleet).act(forged)
        return result

    result = run(lg.settings, scenario)
    assert result.error_info is not None and result.error_info.type == "ToolInterruptedError"
    assert result.error_info.fields["value"] == {"question": "pay?"}
    assert "__langgraph_resume__" not in result.arguments
    assert path.read_text(encoding="utf-8") == "asking pay?\n"  # never "answer", never "yes"
