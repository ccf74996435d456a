"""Helpers for the OpenAI Agents SDK adapter's tests: a scripted model (the SDK's own
``agents.testing.ScriptedModel``, no network), what a model turn reads back, and the parity
runs: one script with the tools run by the SDK in this process and by ``on_fleet`` on workers
loading ``tests.support.openai_agents_tools`` (:func:`parity_workers`, :func:`run_both`).

Run as ``python -m tests.support.openai_agents_support SCRIPT.py``: runs a printed agent script
with every model the SDK would fetch from its default provider replaced by a scripted one that
calls each tool the agent offers once (``word_count`` and ``greet`` of the documentation's
example), then answers with the tool outputs it read, joined by `` | ``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import runpy
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from agents import Agent, FunctionTool, Runner, function_tool, set_tracing_disabled
from agents.models.interface import Model
from agents.models.multi_provider import MultiProvider
from agents.run_config import RunConfig
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from tests.support.fleet import private_workers
from toolfleet.adapters.openai_agents import on_fleet
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.settings import Settings

__all__ = [
    "PARITY_TOOLS",
    "RUN",
    "answer_with_outputs",
    "call_outputs",
    "calls_turn",
    "parity_workers",
    "run_agent",
    "run_both",
    "scripted",
    "sdk_tool",
]

RUN = RunConfig(tracing_disabled=True)
PARITY_TOOLS = ("tests.support.sample_tools", "tests.support.openai_agents_tools")
Read = dict[str, str]


def call_outputs(model_input: Any) -> dict[str, str]:
    """The ``function_call_output`` items of a model call's input, by call id."""
    items = model_input if isinstance(model_input, list) else []
    outputs: dict[str, str] = {}
    for item in items:
        data = item if isinstance(item, dict) else getattr(item, "model_dump", dict)()
        if data.get("type") == "function_call_output":
            outputs[str(data["call_id"])] = str(data["output"])
    return outputs


def calls_turn(calls: Sequence[tuple[str, dict[str, Any], str]]) -> list[Any]:
    """One model turn of parallel function calls: (name, arguments, call id) each."""
    return [function_call(name, arguments, call_id=call_id) for name, arguments, call_id in calls]


def answer_with_outputs(call: ModelCall) -> list[Any]:
    """A final answer listing the tool outputs the model read, in the order it read them."""
    return [assistant_message(" | ".join(call_outputs(call.input).values()))]


def scripted(*turns: list[Any]) -> ScriptedModel:
    """The turns given, then a final answer that lists the tool outputs of the last turn."""
    return ScriptedModel([*turns, ModelStep.respond(answer_with_outputs)])


@contextlib.contextmanager
def parity_workers(redis_url: str, label: str) -> Iterator[Settings]:
    """Settings of a sync and an async worker of their own loading :data:`PARITY_TOOLS`."""
    with private_workers(redis_url, label, tools=PARITY_TOOLS) as env:
        yield Settings.from_env(env, tools=PARITY_TOOLS)


def sdk_tool(item: Any, **options: Any) -> FunctionTool:
    """The SDK's FunctionTool of a tool function (a fleet_tool's is one already)."""
    if isinstance(item, FunctionTool):
        return dataclasses.replace(item, **options) if options else item
    return function_tool(item, **options)


async def run_agent(
    model: ScriptedModel,
    items: Sequence[Any],
    *,
    fleet: Fleet | None,
    context: Any = None,
    **options: Any,
) -> tuple[Any, Read]:
    """Run one agent of ``items`` (in this process, or on ``fleet``): the run's final output or
    the exception it raised, and what the model read of each call."""
    agent = Agent(name="probe", model=model, tools=[sdk_tool(t, **options) for t in items])
    if fleet is not None:
        on_fleet(agent, branch=Branch(fleet=fleet))
    try:
        result = await Runner.run(agent, "Go.", run_config=RUN, context=context)
        outcome: Any = result.final_output
    except Exception as exc:
        outcome = exc
    read = call_outputs(model.last_call.input) if model.last_call is not None else {}
    return outcome, read


def run_both(
    settings: Settings,
    script: Callable[[], ScriptedModel],
    items: Sequence[Any],
    *,
    context: Any = None,
    **options: Any,
) -> tuple[tuple[Any, Read], tuple[Any, Read]]:
    """``script()`` (a fresh model each time) run by the SDK, then on the fleet."""

    async def scenario() -> tuple[tuple[Any, Read], tuple[Any, Read]]:
        local = await run_agent(script(), items, fleet=None, context=context, **options)
        async with Fleet(settings) as fleet:
            remote = await run_agent(script(), items, fleet=fleet, context=context, **options)
        return local, remote

    return asyncio.run(asyncio.wait_for(scenario(), 60))


_DOC_CALLS = {
    "word_count": {"text": "to be or not to be"},
    "greet": {"name": "Ada"},
}


def main(argv: Sequence[str]) -> None:
    set_tracing_disabled(True)
    # One model for the whole run: the SDK asks its provider for the model at every turn.
    model = scripted(
        calls_turn([(name, args, f"call_{name}") for name, args in _DOC_CALLS.items()])
    )

    def get_model(self: MultiProvider, model_name: str | None) -> Model:
        return model

    MultiProvider.get_model = get_model  # type: ignore[method-assign]
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
