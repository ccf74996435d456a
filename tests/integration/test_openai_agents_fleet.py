"""The OpenAI Agents SDK on the fleet. ``on_fleet(agent)`` makes a real ``agents.Agent``
(openai-agents 0.24) run its function tools on real toolfleet workers: one model turn's parallel
calls are one ``Branch.act`` batch with the SDK's call ids, a failure reaches the model as the
SDK's tool error text, the branch's hooks and gates apply, a replayed turn on the same branch is
not run again (C7), and cancelling the run cancels the calls on their workers (C9). No network:
the model is the SDK's own ``ScriptedModel``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from agents import Agent, Runner, RunResult, function_tool, handoff
from agents.items import ToolCallOutputItem
from agents.run_config import RunConfig
from agents.testing import ScriptedModel
from agents.tool import default_tool_error_function

from tests.support import sample_tools
from tests.support.agent_fleet import cancel_when
from tests.support.cli_support import toolfleet
from tests.support.doc_code import doc_blocks, fleet_for_files
from tests.support.fleet import REPO_ROOT
from tests.support.openai_agents_support import call_outputs, calls_turn, scripted
from tests.support.waiting import until, until_async
from toolfleet.adapters.openai_agents import FleetBinding, binding_of, on_fleet
from toolfleet.adapters.openai_agents_calls import NOT_JSON, context_as_json
from toolfleet.dispatcher import Branch, Fleet, HookPoint, Session
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.wire import CallResult

RUN = RunConfig(tracing_disabled=True)
# What the SDK's default failure_error_function tells the model about any failed tool.
SDK_ERROR_TEXT = default_tool_error_function(None, RuntimeError("any"))  # type: ignore[arg-type]


def _ids(*names: str) -> list[str]:
    """Call ids unique to one test (a branch answers a repeated id from its record, C7)."""
    tag = uuid.uuid4().hex[:8]
    return [f"call_{tag}_{name}" for name in names]


def _count_batches(binding: FleetBinding | None) -> list[list[str]]:
    """Wrap the binding's branch so each act() (one batch) records its calls' ids."""
    assert binding is not None
    batches: list[list[str]] = []
    act = binding.branch.act

    async def counted(requests: Any, **kwargs: Any) -> Any:
        batches.append([r["id"] for r in requests])
        return await act(requests, **kwargs)

    binding.branch.act = counted  # type: ignore[method-assign]
    return batches


def _outputs(result: RunResult) -> dict[str, Any]:
    """The SDK's tool outputs of a run (what the tool returned), by call id."""
    return {
        str(
            item.raw_item["call_id"] if isinstance(item.raw_item, dict) else item.raw_item.call_id
        ): (item.output)
        for item in result.new_items
        if isinstance(item, ToolCallOutputItem)
    }


def _sample_agent(model: ScriptedModel, *tools: Any) -> Agent[Any]:
    return Agent(name="probe", model=model, tools=[function_tool(t) for t in tools])


@pytest.mark.usefixtures("sync_worker", "async_worker")
def test_one_turns_parallel_calls_run_as_one_batch_on_the_workers_with_the_sdks_ids(
    fleet_settings: Settings, redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    ids = _ids("whoami", "whoami_async", "fail")
    model = scripted(
        calls_turn(
            [
                ("whoami", {}, ids[0]),
                ("whoami_async", {"delay_s": 0.2}, ids[1]),
                ("fail", {"message": "broken on purpose"}, ids[2]),
            ]
        )
    )
    pre: list[tuple[str, str]] = []

    async def scenario() -> tuple[RunResult, Branch, list[list[str]]]:
        async with Fleet(fleet_settings) as fleet:
            branch = Branch(fleet=fleet)
            branch.hooks.on(
                HookPoint.TOOL_PRE, lambda p: pre.append((p["tool_name"], p["call_id"]))
            )
            agent = _sample_agent(
                model, sample_tools.whoami, sample_tools.whoami_async, sample_tools.fail
            )
            assert on_fleet(agent, branch=branch) is agent
            batches = _count_batches(binding_of(agent))
            result = await Runner.run(agent, "Who runs my tools?", run_config=RUN)
            return result, branch, batches

    result, branch, batches = asyncio.run(asyncio.wait_for(scenario(), 120))

    # The run completed; the tools ran in worker processes, not in this one.
    outputs = _outputs(result)
    assert outputs[ids[0]]["pid"] != os.getpid()
    assert outputs[ids[1]]["pid"] != os.getpid()
    # The failure reached the model as the SDK's own tool error text, under its call id.
    assert model.last_call is not None
    read = call_outputs(model.last_call.input)
    assert list(read) == ids
    assert read[ids[2]] == SDK_ERROR_TEXT
    assert result.final_output == " | ".join(read.values())
    # One act() for the turn's three calls, in the model's order.
    assert batches == [ids]

    # The branch's history, as `toolfleet history --json` prints it: the SDK's ids, in order.
    shown = toolfleet(
        "history", branch.id, "--json", home=tmp_path, env={"TOOLFLEET_BROKER_URL": redis_url}
    )
    assert shown.returncode == 0, shown.stderr
    history = json.loads(shown.stdout)
    requests, responses = history["messages"][::2], history["messages"][1::2]
    assert [m["content"]["tool_call_id"] for m in requests] == ids
    assert [m["content"]["function"] for m in requests] == ["whoami", "whoami_async", "fail"]
    assert [m["content"]["tool_call_id"] for m in responses] == ids
    assert [m["content"]["error"] is None for m in responses] == [True, True, False]
    assert "broken on purpose" in responses[2]["content"]["error"]
    call_ids = [m["content"]["call_id"] for m in requests]
    # The TOOL_PRE hook saw each call, with the call_id history keeps.
    assert pre == list(zip(["whoami", "whoami_async", "fail"], call_ids, strict=True))
    # The workers' own records name one batch for the three calls.
    keys = Keys(fleet_settings.key_prefix)
    records = [CallResult.model_validate_json(redis_client.get(keys.event(c))) for c in call_ids]
    assert {r.batch_id for r in records} != {None}
    assert len({r.batch_id for r in records}) == 1
    assert [r.event["tool_call_id"] for r in records] == ids


@pytest.mark.usefixtures("sync_worker")
def test_a_replayed_turn_on_the_same_branch_does_not_run_its_tools_again(
    fleet_settings: Settings, tmp_path: Path
) -> None:
    """C7: on one branch, the call_id derives from the SDK's tool_call_id, so a run that
    replays a turn's ids is answered from the records without running the tools again."""
    # One file per call: the two calls may run at once, and each returns its file's line count.
    paths = [tmp_path / "first.txt", tmp_path / "second.txt"]
    ids = _ids("first", "second")
    turn = [
        ("append_line", {"path": str(paths[0]), "text": "first"}, ids[0]),
        ("append_line", {"path": str(paths[1]), "text": "second"}, ids[1]),
    ]

    async def scenario() -> list[tuple[RunResult, ScriptedModel]]:
        async with Fleet(fleet_settings) as fleet:
            branch = Branch(fleet=fleet)
            runs = []
            for _ in range(2):
                # The same script each run: a fresh model replays the same tool_call_ids.
                model = scripted(calls_turn(turn))
                agent = on_fleet(_sample_agent(model, sample_tools.append_line), branch=branch)
                result = await Runner.run(agent, "Append.", run_config=RUN)
                runs.append((result, model))
            return runs

    (first, first_model), (replayed, replayed_model) = asyncio.run(
        asyncio.wait_for(scenario(), 120)
    )

    # Each call ran once: the replayed run did not append again.
    assert [p.read_text(encoding="utf-8").splitlines() for p in paths] == [["first"], ["second"]]
    # Both runs completed, and the replay got the first run's outputs, under the same ids.
    first_outputs = _outputs(first)
    assert first_outputs == {ids[0]: 1, ids[1]: 1}
    assert _outputs(replayed) == first_outputs
    assert first_model.last_call is not None and replayed_model.last_call is not None
    read = call_outputs(first_model.last_call.input)
    assert list(read) == ids
    assert call_outputs(replayed_model.last_call.input) == read
    assert replayed.final_output == first.final_output == " | ".join(read.values())


@pytest.mark.usefixtures("sync_worker", "async_worker")
def test_cancelling_the_run_cancels_the_running_async_call_on_its_worker(
    fleet_settings: Settings, redis_client: redis.Redis
) -> None:
    ids = _ids("sleep_async", "echo")
    model = scripted(
        calls_turn([("sleep_async", {"seconds": 30}, ids[0]), ("echo", {"value": "x"}, ids[1])])
    )
    keys = Keys(fleet_settings.key_prefix)
    pre: dict[str, str] = {}

    async def scenario() -> Branch:
        async with Fleet(fleet_settings) as fleet:
            branch = Branch(fleet=fleet)
            branch.hooks.on(
                HookPoint.TOOL_PRE, lambda p: pre.update({p["tool_name"]: p["call_id"]})
            )
            agent = on_fleet(
                _sample_agent(model, sample_tools.sleep_async, sample_tools.echo), branch=branch
            )
            run = asyncio.ensure_future(Runner.run(agent, "Sleep.", run_config=RUN))
            cancelled_at = await cancel_when(
                run,
                lambda: (
                    "sleep_async" in pre and redis_client.exists(keys.started(pre["sleep_async"]))
                ),
                what="the async call to start on its worker",
                timeout_s=20,
            )
            # The cancelled act() writes both calls' units before its cancel goes on.
            await until_async(
                lambda: len(branch.messages) == 4, timeout_s=10, what="both calls recorded"
            )
            return branch, time.monotonic() - cancelled_at

    branch, stop_s = asyncio.run(asyncio.wait_for(scenario(), 60))

    assert stop_s < 10, stop_s  # stopped, not waited for (the sleep is 30 s)

    running = pre["sleep_async"]
    record = until(
        lambda: redis_client.get(keys.event(running)), timeout_s=10, what="the worker's record"
    )
    assert CallResult.model_validate_json(record).execution["status"] == "cancelled"
    statuses = {e.function: e.execution["status"] for e in branch.events}
    assert statuses["sleep_async"] == "cancelled"
    assert [m.content.tool_call_id for m in branch.messages[::2]] == ids


@pytest.mark.usefixtures("sync_worker", "async_worker")
def test_a_session_gate_denies_on_the_fleet_and_the_model_reads_the_sdks_error(
    fleet_settings: Settings,
) -> None:
    """A streamed run, which takes the same path as Runner.run."""
    ids = _ids("add", "echo")
    model = scripted(
        calls_turn([("add", {"a": 1, "b": 2}, ids[0]), ("echo", {"value": "kept"}, ids[1])])
    )

    async def scenario() -> tuple[Branch, list[list[str]]]:
        async with Fleet(fleet_settings) as fleet:
            session = Session(fleet)
            session.gate(lambda invocation: invocation.function != "add")
            agent = on_fleet(
                _sample_agent(model, sample_tools.add, sample_tools.echo), session=session
            )
            binding = binding_of(agent)
            assert binding is not None and binding.branch.session is session
            batches = _count_batches(binding)
            streamed = Runner.run_streamed(agent, "Add.", run_config=RUN)
            async for _ in streamed.stream_events():
                pass
            return binding.branch, batches

    branch, batches = asyncio.run(asyncio.wait_for(scenario(), 60))

    assert batches == [ids]
    assert model.last_call is not None
    read = call_outputs(model.last_call.input)
    assert read == {ids[0]: SDK_ERROR_TEXT, ids[1]: "kept"}
    add_response = branch.messages[1]
    assert add_response.content.error == "denied by governance gate"
    assert [m.content.tool_call_id for m in branch.messages[::2]] == ids


def test_on_fleet_reaches_handoffs_and_agent_tools_once_and_refuses_what_it_cannot_run(
    fleet_settings: Settings,
) -> None:
    fleet = Fleet(fleet_settings)
    try:
        specialist = Agent(name="specialist", tools=[function_tool(sample_tools.add)])
        helper = Agent(name="helper", tools=[function_tool(sample_tools.echo)])
        triage = Agent(
            name="triage",
            tools=[
                function_tool(sample_tools.whoami),
                helper.as_tool(tool_name="ask_helper", tool_description="Ask the helper."),
            ],
            handoffs=[specialist, handoff(helper)],
        )
        specialist.handoffs = [triage]  # a cycle: each agent is visited once
        on_fleet(triage, fleet=fleet)
        binding = binding_of(triage)
        assert binding is not None
        assert sorted(binding.agents) == ["helper", "specialist", "triage"]
        assert binding_of(specialist) is binding and binding_of(helper) is binding
        # The agent used as a tool stays the SDK's; its own tools are on the fleet.
        ask = triage.tools[1]
        assert getattr(ask, "_toolfleet_binding", None) is None

        # Again, with a new branch: rebound, not wrapped twice.
        other = Branch(fleet=fleet)
        on_fleet(triage, branch=other)
        rebound = binding_of(helper)
        assert rebound is not None and rebound.branch is other
        assert rebound is binding_of(triage) is binding_of(specialist)
        source = helper.tools[0]._toolfleet_source  # type: ignore[union-attr]
        assert source.name == "echo" and not hasattr(source, "_toolfleet_source")

        # A tool the fleet does not know is refused before anything changes, unless local.
        @function_tool
        def not_on_the_fleet(x: int) -> int:
            return x

        lone = Agent(name="lone", tools=[not_on_the_fleet, function_tool(sample_tools.echo)])
        before = list(lone.tools)
        with pytest.raises(ConfigurationError, match="not_on_the_fleet"):
            on_fleet(lone, fleet=fleet)
        assert lone.tools == before
        on_fleet(lone, fleet=fleet, local=["not_on_the_fleet"])
        assert lone.tools[0] is not_on_the_fleet
        assert binding_of(lone) is not None

        # Another function under a fleet tool's name would not be the one the workers run.
        def echo(value: Any = None) -> Any:
            return value

        with pytest.raises(ConfigurationError, match="wraps"):
            on_fleet(Agent(name="impostor", tools=[function_tool(echo)]), fleet=fleet)
        with pytest.raises(ConfigurationError, match=r"agents\.Agent"):
            on_fleet(Branch(fleet=fleet), fleet=fleet)  # type: ignore[type-var]
    finally:
        fleet.close()

    # The run context: JSON values pass through, anything else stays in this process.
    assert context_as_json({"user": "ada", "n": [1, 2]}) == {"user": "ada", "n": [1, 2]}
    assert context_as_json(Settings(broker_url="redis://x")) is not NOT_JSON
    assert context_as_json({"conn": object()}) is NOT_JSON
    assert context_as_json(None) is None


# --- the documented example, run as printed ---------------------------------------------------


def _doc_files() -> dict[str, str]:
    """The files docs/agent-ecosystem.md prints for the OpenAI Agents SDK, by name."""
    blocks = doc_blocks("docs/agent-ecosystem.md")
    return {name: blocks[name] for name in ("sdk_tools.py", "sdk_agent.py")}


@pytest.fixture(scope="module")
def doc_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The documented files in a folder, and a private broker with a sync and an async worker
    importing its ``sdk_tools``."""
    folder = tmp_path_factory.mktemp("sdk-doc")
    with fleet_for_files(folder, _doc_files(), ("sdk_tools",)) as broker_url:
        yield folder, broker_url


def test_the_documented_agent_runs_its_tools_on_the_fleet_with_its_context(
    doc_fleet: tuple[Path, str],
) -> None:
    folder, broker_url = doc_fleet
    glue = [
        line
        for line in _doc_files()["sdk_agent.py"].splitlines()
        if re.search(r"toolfleet|on_fleet|Fleet", line) and not line.lstrip().startswith("#")
    ]
    assert 1 <= len(glue) <= 3, glue
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env.update(
        {
            "TOOLFLEET_BROKER_URL": broker_url,
            "PYTHONPATH": os.pathsep.join([str(folder), str(REPO_ROOT)]),
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.openai_agents_support", str(folder / "sdk_agent.py")],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    # word_count's count, then greet's text: the greeting came from the run context, read on
    # the worker.
    assert proc.stdout.strip().splitlines()[-1] == "6 | Bonjour, Ada"
    # The context travelled as a secret argument: history shows it redacted.
    client = redis.Redis.from_url(broker_url)
    try:
        [history_key] = client.keys(Keys(Settings().key_prefix).history("*"))
        stored = [json.loads(m) for m in client.lrange(history_key, 0, -1)]
    finally:
        client.close()
    greet = next(m for m in stored if m["content"].get("function") == "greet")
    assert greet["content"]["arguments"] == {"name": "Ada", "ctx": "***"}
    assert "Bonjour" not in json.dumps(greet)
