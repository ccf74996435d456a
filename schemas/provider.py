"""A call's result in each provider's shape, paired with the model's tool-call id.

OpenAI Chat Completions wants a ``{"role": "tool", "tool_call_id", "content"}`` message per
call; the Responses API a ``{"type": "function_call_output", "call_id", "output"}`` item (a
``custom_tool_call_output`` item for a custom tool call); the Anthropic Messages API a
``{"type": "tool_result", "tool_use_id", "content", "is_error"}`` block (all of a turn's
blocks go in one ``user`` message). Content is text: a string output as is, any other output
as JSON, and the error text for a call that did not complete.

Typed with the SDKs' own TypedDicts, so a loop typed with them type-checks; the SDKs are
imported for the type checker only, and toolfleet runs without them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args, overload

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.serialize import to_jsonable

if TYPE_CHECKING:
    from anthropic.types import ToolResultBlockParam
    from openai.types.chat import ChatCompletionToolMessageParam
    from openai.types.responses import ResponseCustomToolCallOutputParam
    from openai.types.responses.response_input_param import FunctionCallOutput

__all__ = [
    "RESULT_FORMATS",
    "ResultFormat",
    "ToolResult",
    "anthropic_tool_result",
    "openai_custom_tool_call_output",
    "openai_function_call_output",
    "openai_responses_output",
    "openai_tool_message",
    "render_results",
    "result_text",
]

ResultFormat = Literal["openai", "openai-responses", "anthropic"]
RESULT_FORMATS: tuple[str, ...] = get_args(ResultFormat)


class ToolResult(Protocol):
    """What rendering needs of one call's result (toolfleet.schemas.action.ActionResponseModel has
    it); a Protocol, so this module does not import the model that renders through it.

    A result may also have ``tool_call_type`` (``"custom"`` for an OpenAI custom tool call);
    one without it answers a function call."""

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


def openai_tool_message(result: ToolResult) -> ChatCompletionToolMessageParam:
    """The Chat Completions ``tool`` message answering the call (a custom tool call too)."""
    return {"role": "tool", "tool_call_id": _id(result), "content": result_text(result)}


def openai_function_call_output(result: ToolResult) -> FunctionCallOutput:
    """The Responses API ``function_call_output`` input item answering a function call."""
    return {"type": "function_call_output", "call_id": _id(result), "output": result_text(result)}


def openai_custom_tool_call_output(result: ToolResult) -> ResponseCustomToolCallOutputParam:
    """The Responses API ``custom_tool_call_output`` input item answering a custom tool call."""
    return {
        "type": "custom_tool_call_output",
        "call_id": _id(result),
        "output": result_text(result),
    }


def openai_responses_output(
    result: ToolResult,
) -> FunctionCallOutput | ResponseCustomToolCallOutputParam:
    """The Responses API input item answering the call: ``custom_tool_call_output`` for a
    custom tool call (``tool_call_type == "custom"``), else ``function_call_output``."""
    if getattr(result, "tool_call_type", None) == "custom":
        return openai_custom_tool_call_output(result)
    return openai_function_call_output(result)


def anthropic_tool_result(result: ToolResult) -> ToolResultBlockParam:
    """The Messages API ``tool_result`` block; ``is_error`` for failed, aborted or denied."""
    return {
        "type": "tool_result",
        "tool_use_id": _id(result),
        "content": result_text(result),
        "is_error": result.error is not None,
    }


# A literal format picks its SDK type before the ``str`` fallback does: the order decides, so
# the overlap mypy reports is intended.
@overload
def render_results(  # type: ignore[overload-overlap]
    results: Iterable[ToolResult], format: Literal["openai"] = ...
) -> list[ChatCompletionToolMessageParam]: ...
@overload
def render_results(  # type: ignore[overload-overlap]
    results: Iterable[ToolResult], format: Literal["openai-responses"]
) -> list[FunctionCallOutput | ResponseCustomToolCallOutputParam]: ...
@overload
def render_results(  # type: ignore[overload-overlap]
    results: Iterable[ToolResult], format: Literal["anthropic"]
) -> list[ToolResultBlockParam]: ...
@overload
def render_results(results: Iterable[ToolResult], format: str) -> list[dict[str, Any]]: ...
def render_results(results: Iterable[ToolResult], format: str = "openai") -> list[Any]:
    """Every result in ``format``, in the order given (Branch.act() returns input order).

    ``openai``: the ``tool`` messages to append to ``messages``; ``openai-responses``: the
    ``function_call_output`` (or ``custom_tool_call_output``) items to send as ``input``;
    ``anthropic``: the ``tool_result`` blocks that make the content of the next ``user``
    message. Typed per format with the SDK's own TypedDict (a ``str`` format: a dict).
    """
    render = _RENDERERS.get(format)
    if render is None:
        raise ConfigurationError(
            f"result format {format!r} is not one of {list(RESULT_FORMATS)}; pass 'openai' "
            "for Chat Completions, 'openai-responses' or 'anthropic'"
        )
    return [render(r) for r in results]


_RENDERERS: dict[str, Callable[[ToolResult], Any]] = {
    "openai": openai_tool_message,
    "openai-responses": openai_responses_output,
    "anthropic": anthropic_tool_result,
}
