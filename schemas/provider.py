"""A call's result in each provider's shape, paired with the model's tool-call id.

OpenAI Chat Completions wants a ``{"role": "tool", "tool_call_id", "content"}`` message per
call; the Responses API a ``{"type": "function_call_output", "call_id", "output"}`` item; the
Anthropic Messages API a ``{"type": "tool_result", "tool_use_id", "content", "is_error"}``
block (all of a turn's blocks go in one ``user`` message). Content is text: a string output as
is, any other output as JSON, and the error text for a call that did not complete.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal, Protocol, get_args

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.serialize import to_jsonable

__all__ = [
    "RESULT_FORMATS",
    "ResultFormat",
    "ToolResult",
    "anthropic_tool_result",
    "openai_function_call_output",
    "openai_tool_message",
    "render_results",
    "result_text",
]

ResultFormat = Literal["openai", "openai-responses", "anthropic"]
RESULT_FORMATS: tuple[str, ...] = get_args(ResultFormat)


class ToolResult(Protocol):
    """What rendering needs of one call's result (toolfleet.schemas.action.ActionResponseModel has
    it); a Protocol, so this module does not import the model that renders through it."""

    @property
    def function(self) -> str: ...
    @property
    def output(self) -> Any: ...
    @property
    def error(self) -> str | None: ...
    @property
    def call_id(self) -> str | None: ...
    @property
    def tool_call_id(self) -> str | None: ...


def result_text(result: ToolResult) -> str:
    """The text a model reads: the error for a call that did not complete, else the output
    (a string as is, anything else as JSON)."""
    if result.error is not None:
        return result.error
    output = result.output
    if isinstance(output, str):
        return output
    return json.dumps(to_jsonable(output), ensure_ascii=False)


def _id(result: ToolResult) -> str:
    tool_call_id = result.tool_call_id or result.call_id
    if not tool_call_id:
        raise ConfigurationError(
            f"result of {result.function!r} has no tool_call_id nor call_id to pair it with; "
            "render results returned by Branch.act()"
        )
    return tool_call_id


def openai_tool_message(result: ToolResult) -> dict[str, Any]:
    """The Chat Completions ``tool`` message answering the call."""
    return {"role": "tool", "tool_call_id": _id(result), "content": result_text(result)}


def openai_function_call_output(result: ToolResult) -> dict[str, Any]:
    """The Responses API ``function_call_output`` input item answering the call."""
    return {"type": "function_call_output", "call_id": _id(result), "output": result_text(result)}


def anthropic_tool_result(result: ToolResult) -> dict[str, Any]:
    """The Messages API ``tool_result`` block; ``is_error`` for failed, aborted or denied."""
    return {
        "type": "tool_result",
        "tool_use_id": _id(result),
        "content": result_text(result),
        "is_error": result.error is not None,
    }


def render_results(results: Iterable[ToolResult], format: str = "openai") -> list[dict[str, Any]]:
    """Every result in ``format``, in the order given (Branch.act() returns input order).

    ``openai``: the ``tool`` messages to append to ``messages``; ``openai-responses``: the
    ``function_call_output`` items to send as ``input``; ``anthropic``: the ``tool_result``
    blocks that make the content of the next ``user`` message.
    """
    render = _RENDERERS.get(format)
    if render is None:
        raise ConfigurationError(
            f"result format {format!r} is not one of {list(RESULT_FORMATS)}; pass 'openai' "
            "for Chat Completions, 'openai-responses' or 'anthropic'"
        )
    return [render(r) for r in results]


_RENDERERS = {
    "openai": openai_tool_message,
    "openai-responses": openai_function_call_output,
    "anthropic": anthropic_tool_result,
}
