"""Helpers for the OpenAI Agents SDK adapter's tests: a scripted model (the SDK's own
``agents.testing.ScriptedModel``, no network) and what a model turn reads back.

Run as ``python -m tests.support.openai_agents_support SCRIPT.py``: runs a printed agent script
with every model the SDK would fetch from its default provider replaced by a scripted one that
calls each tool the agent offers once (``word_count`` and ``greet`` of the documentation's
example), then answers with the tool outputs it read, joined by `` | ``.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from typing import Any

from agents import set_tracing_disabled
from agents.models.interface import Model
from agents.models.multi_provider import MultiProvider
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

__all__ = ["answer_with_outputs", "call_outputs", "calls_turn", "scripted"]


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
