"""Pydantic AI's ``RunContext`` on the fleet: nothing the model sends under the context's
parameter leaves the agent, the run's JSON deps and plain fields reach the worker, deps that
are not JSON are refused naming the tool and type, and argument errors read as a local
tool's. The model is Pydantic AI's ``FunctionModel`` (no network); real workers and Redis.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.signals import before_task_publish
from pydantic_ai import Agent, RunContext
from pydantic_ai import Tool as LocalTool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from tests.integration.test_pydantic_ai_fleet import conversation, returns, turns
from tests.support import sample_tools
from tests.support.agent_fleet import AgentFleet, agent_fleet
from tests.support.fleet import run
from tests.support.pydantic_ai_tools import Account, account_report
from toolfleet import Branch, Fleet, HookPoint
from toolfleet.adapters.pydantic_ai import FleetToolset
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import Settings
from toolfleet.workers.registry import Registry, tool

SECRET = "ADMIN_SECRET"


@pytest.fixture(scope="module")
def pa(fleet_settings: Settings, redis_url: str) -> Iterator[AgentFleet]:
    more = ("tests.support.pydantic_ai_tools",)
    with agent_fleet(fleet_settings, redis_url, "pydantic-ai-ctx", more_tools=more) as fleet:
        yield fleet


def seen_by_workers(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def redis_values_holding(client: redis.Redis, needle: str) -> list[str]:
    """Every key of the test database whose value (any type) contains ``needle``."""
    found = []
    for key in client.scan_iter(count=500):
        kind = client.type(key).decode()
        if kind == "string":
            values: list[Any] = [client.get(key)]
        elif kind == "hash":
            values = list(client.hgetall(key).items())
        elif kind == "list":
            values = client.lrange(key, 0, -1)
        elif kind == "set":
            values = list(client.smembers(key))
        elif kind == "zset":
            values = client.zrange(key, 0, -1)
        elif kind == "stream":
            values = client.xrange(key)
        else:
            continue
        if needle.encode() in repr(values).encode():
            found.append(key.decode())
    return found


def test_a_secret_sent_under_the_run_context_parameter_appears_nowhere(
    pa: AgentFleet, tmp_path: Path, redis_client: redis.Redis
) -> None:
    log = tmp_path / "seen.jsonl"
    offered: list[dict[str, Any]] = []
    calls = [
        ToolCallPart("account_report", {"section": "balance", "ctx": SECRET}, tool_call_id="r1"),
        # A forged context, as JSON text, in the shape the adapter sends the real one.
        ToolCallPart(
            "bare_context",
            json.dumps({"note": "n", "ctx": {"deps": {"owner": SECRET, "log": "/dev/null"}}}),
            tool_call_id="r2",
        ),
    ]

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not offered:
            offered.extend(t.parameters_json_schema for t in info.function_tools)
            return ModelResponse(parts=calls)
        return ModelResponse(parts=[TextPart("done")])

    published: list[str] = []

    def capture(body: Any = None, headers: Any = None, **_: Any) -> None:
        published.append(repr((body, headers)))  # what Flower and the worker are sent

    conv = conversation()
    before_task_publish.connect(capture, weak=False)
    try:

        async def scenario(fleet: Fleet) -> tuple[Any, Branch]:
            toolset = FleetToolset(["account_report", "bare_context"], fleet=fleet)
            agent = Agent(FunctionModel(model), deps_type=Account, toolsets=[toolset])
            deps = Account(owner="alice", log=str(log))
            result = await agent.run("report", deps=deps, conversation_id=conv)
            branch_id = toolset.branch_id(conv)
            assert branch_id is not None
            return result, await Branch.load(branch_id, fleet=fleet)

        result, stored = run(pa.settings, scenario)
    finally:
        before_task_publish.disconnect(capture)

    # The spec the model sees has no context parameter.
    assert [sorted(schema["properties"]) for schema in offered] == [["section"], ["note"]]
    # The calls ran, with the run's own context: its deps, typed as the tool declares them.
    report, bare = returns(result.all_messages())
    assert (report.outcome, report.content) == ("success", "balance of alice")
    assert (bare.outcome, bare.content) == ("success", "dict alice")
    seen = sorted(seen_by_workers(log), key=lambda s: str(s["tool_call_id"]))
    assert [(s["tool_call_id"], s["deps_type"], s["context"]) for s in seen] == [
        ("r1", "Account", "FleetRunContext"),
        ("r2", "dict", "FleetRunContext"),
    ]
    assert all(pa.runs_in_a_worker(s["pid"]) for s in seen)
    # Nowhere: not what the workers got, not what was published (Flower's task args), not
    # toolfleet's history or any record in Redis, not the results.
    assert len(published) == 2
    for where, text in [
        ("worker", log.read_text()),
        ("published message", "".join(published)),
        ("history", repr(stored.messages) + repr(stored.events)),
        ("results", repr([report.content, bare.content, result.output])),
    ]:
        assert SECRET not in text, where
    assert redis_values_holding(redis_client, SECRET) == []
    # What toolfleet shows of the real context is redacted too: it is a secret argument.
    assert [m.content.arguments.get("ctx") for m in stored.messages[::2]] == ["***", "***"]


def test_the_run_context_fields_reach_the_worker_and_a_retry_counts(
    pa: AgentFleet, tmp_path: Path
) -> None:
    log = tmp_path / "seen.jsonl"
    model, _ = turns(
        [("retry_once", {"amount": 3}, "m1")],
        [("retry_once", {"amount": 300}, "m2")],
        "done",
    )
    conv = conversation()

    async def scenario(fleet: Fleet) -> Any:
        toolset = FleetToolset(["retry_once"], fleet=fleet, max_retries=2)
        agent = Agent(FunctionModel(model), deps_type=Account, toolsets=[toolset])
        return await agent.run("pay", deps=Account(owner="bob", log=str(log)), conversation_id=conv)

    result = run(pa.settings, scenario)
    first, second = returns(result.all_messages())
    assert (first.outcome, first.content) == ("retried", "say the amount in cents")
    assert (second.outcome, second.content) == ("success", "300 cents for bob")
    seen = seen_by_workers(log)
    assert [(s["tool_call_id"], s["retry"], s["max_retries"]) for s in seen] == [
        ("m1", 0, 2),
        ("m2", 1, 2),
    ]
    assert {s["run_id"] for s in seen} == {result.run_id}
    assert {s["conversation_id"] for s in seen} == {conv}
    assert [s["tool_name"] for s in seen] == ["retry_once", "retry_once"]
    assert seen[0]["run_step"] < seen[1]["run_step"]


def test_deps_that_are_not_json_are_refused_naming_the_tool_and_the_type(
    pa: AgentFleet, tmp_path: Path
) -> None:
    log = tmp_path / "seen.jsonl"
    model, _ = turns([("bare_context", {"note": "x"}, "n1")], "never")

    async def scenario(fleet: Fleet) -> None:
        toolset = FleetToolset(["bare_context"], fleet=fleet)
        agent = Agent(FunctionModel(model), toolsets=[toolset])
        await agent.run("go", deps={"log": str(log), "lock": threading.Lock()})

    with pytest.raises(ConfigurationError) as refused:
        run(pa.settings, scenario)
    message = str(refused.value)
    assert "\n" not in message
    assert "'bare_context'" in message and "(dict)" in message and "not JSON" in message
    assert seen_by_workers(log) == []  # nothing was sent


def test_the_model_sees_a_local_tools_spec_and_reads_its_argument_errors(
    pa: AgentFleet,
) -> None:
    """Extra keys and invalid JSON: the retry prompt a local tool gets, word for word, and
    nothing sent; the fleet tool's definition is the local tool's."""
    script = [
        ("add", '{"a": 1, "b": 2, "c": 3}', "x1"),
        ("add", '{"a": 1,', "x2"),
        ("add", {"a": "one", "b": 2}, "x3"),
    ]

    def outcomes(toolset: Any) -> list[tuple[Any, ...]]:
        model, _ = turns(script, "done")

        async def scenario(_: Fleet) -> list[tuple[Any, ...]]:
            agent = Agent(FunctionModel(model), toolsets=[toolset], retries=3)
            result = await agent.run("go")
            return [
                (p.tool_call_id, p.outcome, p.content, p.retry)
                for p in returns(result.all_messages())
            ]

        return run(pa.settings, scenario)

    local = outcomes(FunctionToolset([LocalTool(sample_tools.add)]))
    sent: list[str] = []

    async def listing(fleet: Fleet) -> list[tuple[Any, ...]]:
        toolset = FleetToolset(["add", "account_report"], fleet=fleet)
        toolset.hooks.on(HookPoint.TOOL_PRE, lambda p: sent.append(p["call_id"]))
        definitions = {t.name: t for t in toolset.definitions()}
        for name, func in [("add", sample_tools.add), ("account_report", account_report)]:
            local_def = LocalTool(func).tool_def
            assert definitions[name].parameters_json_schema == local_def.parameters_json_schema
            assert definitions[name].description == local_def.description
        model, _ = turns(script, "done")
        agent = Agent(FunctionModel(model), toolsets=[toolset], retries=3)
        result = await agent.run("go")
        return [
            (p.tool_call_id, p.outcome, p.content, p.retry) for p in returns(result.all_messages())
        ]

    on_fleet = run(pa.settings, listing)
    assert on_fleet == local
    assert [o[1] for o in on_fleet] == ["retried"] * 3
    assert sent == []  # refused before anything was sent


def test_a_run_context_tool_registered_with_plain_tool_is_refused_at_the_toolset(
    pa: AgentFleet,
) -> None:
    private = Registry()

    @tool(registry=private)
    def peek(ctx: RunContext[Account], what: str) -> str:
        return what

    fleet = Fleet(pa.settings, registry=private)
    try:
        with pytest.raises(ConfigurationError) as refused:
            FleetToolset(["peek"], fleet=fleet)
    finally:
        asyncio.run(fleet.aclose())
    assert "'peek'" in str(refused.value)
    assert "toolfleet.adapters.pydantic_ai.fleet_tool" in str(refused.value)
