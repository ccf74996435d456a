"""Nothing hidden leaves the agent: a parameter LangGraph injects (``InjectedState``,
``InjectedToolCallId``, a subclass of ``InjectedToolArg``) is not in the spec the model sees,
and a value the model forges for it reaches nothing — not the worker, not toolfleet's history,
not Redis (so not Flower: what Flower shows of a task comes from its message and its events),
not the result. The framework's own value reaches the tool, and stays out of the records.
Real workers, a scripted model.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langgraph.graph import MessagesState
from langgraph.prebuilt import ToolNode
from pydantic import BaseModel

from tests.support import langgraph_tools
from tests.support.agent_fleet import TOOLS, AgentFleet, agent_fleet
from tests.support.fleet import run
from tests.support.langgraph_support import (
    ScriptedChatModel,
    agent_loop,
    calls,
    carries,
    redis_traffic,
)
from toolfleet import Branch, Fleet
from toolfleet.adapters.langgraph import FleetToolNode
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import Settings

SECRET = f"ADMIN_SECRET-{uuid.uuid4().hex}"
STATE_AUTH = f"state-auth-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def lg(fleet_settings: Settings, redis_url: str) -> Iterator[AgentFleet]:
    tools = (*TOOLS, "tests.support.langgraph_tools")
    with agent_fleet(fleet_settings, redis_url, "langgraph-hidden", tools) as fleet:
        yield fleet


class NoteState(MessagesState):
    auth: str


def note_graph(model: Any, node: ToolNode) -> Any:
    return agent_loop(model, node, NoteState)


def forged_turn(path: Path) -> AIMessage:
    forged = {"text": "hello", "path": str(path), "auth": SECRET, "note_id": SECRET}
    return calls(("file_note", {**forged, "audit": SECRET}, "call_note"))


def test_a_value_the_model_forges_for_an_injected_parameter_reaches_nothing(
    lg: AgentFleet, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    received = tmp_path / "fleet.jsonl"
    model = ScriptedChatModel(replies=[forged_turn(received), AIMessage("done")])
    thread_id = f"t-{uuid.uuid4().hex[:8]}"

    async def scenario(fleet: Fleet) -> tuple[dict[str, Any], Branch, list[bytes], Any]:
        node = FleetToolNode(["file_note"], fleet=fleet)
        graph = note_graph(model.bind_tools(node.tools), node)
        with redis_traffic(redis_url) as traffic:
            out = await graph.ainvoke(
                {"messages": [HumanMessage("note it")], "auth": STATE_AUTH},
                {"configurable": {"thread_id": thread_id}},
            )
        branch_id = node.branch_id(thread_id)
        assert branch_id is not None
        stored = await Branch.load(branch_id, fleet=fleet)
        return out, stored, traffic, fleet.registry.specs("openai", names=["file_note"])

    out, stored, traffic, [fleet_spec] = run(lg.settings, scenario)

    # The model is shown the model's arguments only, by LangChain and by toolfleet alike.
    [shown] = model.bound
    for parameters in (shown["function"]["parameters"], fleet_spec["function"]["parameters"]):
        assert set(parameters["properties"]) == {"text", "path"}
        assert sorted(parameters["required"]) == ["path", "text"]
    # The worker got the framework's values: the state's auth, the real tool-call id.
    [line] = received.read_text().splitlines()
    assert json.loads(line) == {
        "text": "hello",
        "auth": STATE_AUTH,
        "note_id": "call_note",
        "audit": None,
    }
    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert answer.status == "success"
    assert json.loads(str(answer.content)) == {
        "filed": "hello",
        "by": STATE_AUTH[:5],
        "note": "call_note",
    }
    # The forged value is nowhere: the result, the history, any command Redis received
    # (the call's message, its records, the workers' events), any key left in Redis.
    assert not carries(json.dumps([m.model_dump() for m in out["messages"][2:]]), SECRET)
    history = [m.model_dump_json() for m in stored.messages]
    history += [json.dumps(e.to_dict(), default=str) for e in stored.events]
    assert stored.messages and not any(carries(h, SECRET) for h in history)
    assert traffic and not [c for c in traffic if carries(c, SECRET)]
    assert any(carries(c, STATE_AUTH) for c in traffic)  # the in-flight message carries it
    for key in redis_client.scan_iter(count=1000):
        if redis_client.type(key) == b"string":
            assert not carries(redis_client.get(key) or b"", SECRET), key
    # The framework's own value stays out of the history too: the tool alone sees it.
    assert not any(carries(h, STATE_AUTH) for h in history)

    # ToolNode, running the same function locally, answers alike.
    local_file = tmp_path / "local.jsonl"
    local_model = ScriptedChatModel(replies=[forged_turn(local_file), AIMessage("done")])
    local = ToolNode([StructuredTool.from_function(langgraph_tools.file_note)])
    local_out = note_graph(local_model, local).invoke(
        {"messages": [HumanMessage("note it")], "auth": STATE_AUTH}
    )
    [local_answer] = [m for m in local_out["messages"] if isinstance(m, ToolMessage)]
    # (The graph gives each message an id of its own.)
    assert local_answer.model_dump(exclude={"id"}) == answer.model_dump(exclude={"id"})
    assert json.loads(local_file.read_text()) == json.loads(line)


class ExposedNote(BaseModel):
    text: str
    path: str
    auth: str


def test_a_schema_that_lets_a_hidden_argument_through_is_stopped(
    lg: AgentFleet, tmp_path: Path
) -> None:
    """A LangChain tool whose schema is a dict passes the model's keys unchecked (ToolNode
    would hand them to a local function): only the keys its schema names are sent. A schema
    that shows the model a parameter the fleet's function declares injected is refused."""
    received = tmp_path / "loose.jsonl"
    loose = StructuredTool(
        name="file_note",
        description="File a note.",
        args_schema={
            "type": "object",
            "properties": {"text": {"type": "string"}, "path": {"type": "string"}},
            "required": ["text", "path"],
        },
        func=langgraph_tools.file_note,
    )
    exposed = StructuredTool(
        name="file_note",
        description="File a note.",
        args_schema=ExposedNote,
        func=langgraph_tools.file_note,
    )
    fleet = Fleet(lg.settings)
    try:
        node = FleetToolNode([loose], fleet=fleet, handle_tool_errors=True)
        [answer] = node.invoke({"messages": [forged_turn(received)]})["messages"]
        with pytest.raises(ConfigurationError, match=r"shows the model the parameters \['auth'\]"):
            FleetToolNode([exposed], fleet=fleet)
    finally:
        fleet.close()
    # The function ran without the forged values: it misses the parameters LangGraph injects.
    assert answer.status == "error" and "missing 2 required" in str(answer.content)
    assert not carries(answer.model_dump_json(), SECRET) and not received.exists()
