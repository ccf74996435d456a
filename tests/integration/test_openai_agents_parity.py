"""The OpenAI Agents SDK adapter behaves as the SDK's own executor, apart from where the tools
run: each scenario runs one script of the SDK's ``ScriptedModel`` (no network) against the SDK
running the tools in this process and against ``on_fleet`` with real workers, and compares
what the model read, what the run raised and what reached the worker. A value the model sends
under the hidden context parameter, or under any key the schema does not name, reaches no
worker, no Redis command (history, messages, records) and no result.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import re
import uuid
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from agents.exceptions import ModelBehaviorError
from agents.testing import ScriptedModel, function_call
from agents.tool_guardrails import (
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    ToolOutputGuardrailData,
    tool_input_guardrail,
    tool_output_guardrail,
)

from tests.support import openai_agents_tools as tools
from tests.support import sample_tools
from tests.support.command_log import CommandLog
from tests.support.openai_agents_support import (
    RUN,
    call_outputs,
    calls_turn,
    parity_workers,
    run_both,
    scripted,
    sdk_tool,
)
from toolfleet.adapters.openai_agents import binding_of, on_fleet
from toolfleet.dispatcher import Fleet
from toolfleet.schemas.settings import Settings
from toolfleet.workers.registry import registry
from toolfleet.workers.specs import tool_spec

SECRET = "ADMIN_SECRET"


@pytest.fixture(scope="module")
def settings(redis_url: str) -> Iterator[Settings]:
    with parity_workers(redis_url, "sdk-parity") as found:
        yield found


def _decoded(commands: Sequence[str]) -> str:
    """Every Redis command, with each base64 run in it decoded too (kombu's message bodies)."""
    parts = list(commands)
    for command in commands:
        for chunk in re.findall(r"[A-Za-z0-9+/]{24,}={0,2}", command):
            try:
                parts.append(base64.b64decode(chunk, validate=True).decode("utf-8", "replace"))
            except (binascii.Error, ValueError):
                continue
    return "\n".join(parts)


def test_a_secret_sent_under_the_hidden_context_parameter_or_any_unnamed_key_reaches_nothing(
    settings: Settings, redis_url: str, redis_db: int, tmp_path: Path
) -> None:
    side = tmp_path / "received.jsonl"
    name = f"Ada-{uuid.uuid4().hex[:8]}"  # a value that does travel: the check can see one
    model = scripted(
        calls_turn(
            [
                ("remember", {"side": str(side), "name": name, "ctx": SECRET, "x": SECRET}, "c1"),
                ("echo", {"value": "kept", "ctx": SECRET}, "c2"),
            ]
        )
    )
    # The spec the model sees, and toolfleet's, name no context parameter.
    assert set(tools.remember.params_json_schema["properties"]) == {"side", "name"}
    assert "ctx" not in json.dumps(tool_spec(registry.get("remember")))

    async def scenario() -> tuple[Any, str]:
        async with Fleet(settings) as fleet:
            agent = Agent(
                name="probe", model=model, tools=[tools.remember, function_tool(sample_tools.echo)]
            )
            on_fleet(agent, fleet=fleet)
            binding = binding_of(agent)
            assert binding is not None
            result = await Runner.run(agent, "Go.", run_config=RUN, context={"user": "ada"})
            stored = [m.model_dump_json() for m in binding.branch.messages]
            return result, "\n".join(stored)

    with CommandLog(redis_url, redis_db) as log:
        result, history = asyncio.run(asyncio.wait_for(scenario(), 60))

    # The tool ran on a worker with the framework's context and the named arguments only.
    [received] = [json.loads(line) for line in side.read_text(encoding="utf-8").splitlines()]
    assert received["pid"] != os.getpid()
    assert received["context"] == {"user": "ada"}
    assert received["tool_call_id"] == "c1" and received["tool_name"] == "remember"
    assert json.loads(received["tool_arguments"]) == {"side": str(side), "name": name}
    assert SECRET not in side.read_text(encoding="utf-8")
    # The model read both results; none of them, nor history, carries the secret.
    assert model.last_call is not None
    assert call_outputs(model.last_call.input) == {"c1": f"hello {name}", "c2": "kept"}
    assert SECRET not in repr(result.final_output)
    assert name in history and SECRET not in history
    # Nothing sent to Redis carried it: messages (Flower's task args among them), records,
    # history. The named argument is there, so the search reads the message bodies.
    sent = _decoded(log.commands)
    assert name in sent
    assert SECRET not in sent


def test_outputs_and_unnamed_keys_read_as_in_the_sdks_own_executor(settings: Settings) -> None:
    def script() -> ScriptedModel:
        return scripted(
            calls_turn(
                [
                    ("make_model", {"bar": "x", "unnamed": 1}, "c1"),
                    ("make_error", {"message": "returned, not raised"}, "c2"),
                    ("make_pair", {"first": 1, "second": 2}, "c3"),
                ]
            )
        )

    (local, local_read), (remote, remote_read) = run_both(
        settings, script, [tools.make_model, tools.make_error, tools.make_pair]
    )
    assert local_read == {"c1": "bar='x'", "c2": "returned, not raised", "c3": "(1, 2)"}
    assert remote_read == local_read
    assert remote == local


def test_invalid_json_arguments_raise_the_sdks_model_behavior_error_before_anything_runs(
    settings: Settings,
) -> None:
    def script() -> ScriptedModel:
        return scripted([function_call("make_model", "{not json", call_id="c1")])

    # The default failure_error_function: the model reads the SDK's text.
    (_, local_read), (_, remote_read) = run_both(settings, script, [tools.make_model])
    assert remote_read == local_read and "error" in local_read["c1"]

    # failure_error_function=None: the run raises the SDK's ModelBehaviorError.
    (local, _), (remote, _) = run_both(
        settings, script, [tools.make_model], failure_error_function=None
    )
    assert isinstance(local, ModelBehaviorError) and type(remote) is type(local)
    assert str(remote) == str(local)

    # And nothing was sent: no batch on the fleet.
    async def scenario() -> list[int]:
        async with Fleet(settings) as fleet:
            agent = Agent(name="probe", model=script(), tools=[sdk_tool(tools.make_model)])
            on_fleet(agent, fleet=fleet)
            await Runner.run(agent, "Go.", run_config=RUN)
            binding = binding_of(agent)
            assert binding is not None
            return list(binding.batch_sizes)

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == []


def test_a_typed_context_travels_as_json_and_is_rebuilt_on_the_worker(settings: Settings) -> None:
    def profile_script() -> ScriptedModel:
        return scripted(calls_turn([("profile_line", {"greeting": "Hi"}, "c1")]))

    def account_script() -> ScriptedModel:
        return scripted(calls_turn([("account_line", {"label": "Acct"}, "c1")]))

    (_, local_read), (_, remote_read) = run_both(
        settings, profile_script, [tools.profile_line], context=tools.Profile(name="Ada", tier=2)
    )
    assert local_read == {"c1": "Hi Ada tier 2 (Profile)"}
    assert remote_read == local_read
    (_, local_read), (_, remote_read) = run_both(
        settings, account_script, [tools.account_line], context=tools.Account("Ada", 12.5)
    )
    assert local_read == {"c1": "Acct: Ada has 12.5 (Account)"}
    assert remote_read == local_read


def test_a_context_with_no_json_form_is_a_warning_at_the_first_call_naming_tool_and_type(
    settings: Settings, tmp_path: Path
) -> None:
    side = tmp_path / "received.jsonl"

    class LiveClient:
        pass

    def script(call_id: str) -> ScriptedModel:
        return scripted(calls_turn([("remember", {"side": str(side), "name": "Ada"}, call_id)]))

    async def scenario() -> None:
        async with Fleet(settings) as fleet:
            # One branch for both runs: each run's call has an id of its own (C7).
            agent = Agent(name="probe", model=script("c1"), tools=[tools.remember])
            on_fleet(agent, fleet=fleet)
            with pytest.warns(RuntimeWarning, match=r"'remember'.*LiveClient.*no JSON form"):
                await Runner.run(agent, "Go.", run_config=RUN, context=LiveClient())
            agent.model = script("c2")
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                await Runner.run(agent, "Go.", run_config=RUN, context=LiveClient())

    asyncio.run(asyncio.wait_for(scenario(), 60))
    # The call still ran, with no context, and the second run was not warned again.
    lines = [json.loads(line) for line in side.read_text(encoding="utf-8").splitlines()]
    assert [line["context"] for line in lines] == [None, None]


@tool_input_guardrail
def no_forbidden_input(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    if "forbidden" in data.context.tool_arguments:
        return ToolGuardrailFunctionOutput.reject_content("input refused by the guardrail")
    return ToolGuardrailFunctionOutput.allow()


@tool_output_guardrail
def no_shouted_secret(data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
    if "SECRET" in str(data.output):
        return ToolGuardrailFunctionOutput.reject_content("output withheld by the guardrail")
    return ToolGuardrailFunctionOutput.allow()


def test_tool_guardrails_run_around_the_fleet_call_as_around_a_local_one(
    settings: Settings,
) -> None:
    def script() -> ScriptedModel:
        return scripted(
            calls_turn(
                [
                    ("shout", {"text": "forbidden"}, "c1"),
                    ("shout", {"text": "secret"}, "c2"),
                    ("shout", {"text": "fine"}, "c3"),
                ]
            )
        )

    (_, local_read), (_, remote_read) = run_both(
        settings,
        script,
        [tools.shout],
        tool_input_guardrails=[no_forbidden_input],
        tool_output_guardrails=[no_shouted_secret],
    )
    assert local_read == {
        "c1": "input refused by the guardrail",
        "c2": "output withheld by the guardrail",
        "c3": "FINE",
    }
    assert remote_read == local_read


def test_failure_error_function_gets_the_tools_own_exception_and_none_raises_as_the_sdk(
    settings: Settings,
) -> None:
    def script() -> ScriptedModel:
        return scripted(calls_turn([("raise_value", {"message": "bad input"}, "c1")]))

    def describe(ctx: Any, error: Exception) -> str:
        return f"{type(error).__name__}|{error}|{type(error.__cause__).__name__}"

    (_, local_read), (_, remote_read) = run_both(
        settings, script, [tools.raise_value], failure_error_function=describe
    )
    assert local_read == {"c1": "ValueError|bad input|NoneType"}
    assert remote_read == local_read

    (local, _), (remote, _) = run_both(
        settings, script, [tools.raise_value], failure_error_function=None
    )
    assert type(remote) is type(local) and str(remote) == str(local)
    assert str(local) == "Error running tool raise_value: bad input"
    assert type(remote.__cause__) is type(local.__cause__) is ValueError
