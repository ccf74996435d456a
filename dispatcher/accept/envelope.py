"""Normalize one action-request envelope into ``(function, raw arguments, tool_call_id)``.

Accepted (ADR-0012 D2, plus the shapes model providers and agent frameworks emit):

- a toolfleet ``ActionRequest`` (kept as the history's request), a lionagi ``ActionRequest``;
- a model declaring ``function`` and ``arguments``; a dict with both keys, optionally with
  ``id`` or ``tool_call_id``;
- an OpenAI Chat Completions tool call ``{"id", "type": "function", "function": {"name",
  "arguments"}}``, an OpenAI Responses ``{"type": "function_call", "call_id", "name",
  "arguments"}`` item, an Anthropic ``{"type": "tool_use", "id", "name", "input"}`` block —
  as dicts or as the SDKs' objects (pydantic models, read through ``model_dump``);
- an OpenAI custom tool call: Chat Completions ``{"id", "type": "custom", "custom": {"name",
  "input"}}``, Responses ``{"type": "custom_tool_call", "call_id", "name", "input"}``. Its
  input is free-form text, not JSON: the envelope keeps it as is (``tool_call_type`` "custom")
  and :func:`custom_arguments` gives it to the tool's one string parameter.

Arguments given as a JSON string (what OpenAI sends) are decoded; a string that is not a JSON
object does not make the envelope malformed: it becomes that call's argument error, so the
call keeps its ``tool_call_id`` and the model gets an error result paired with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel

from toolfleet.schemas.contract import safe_repr
from toolfleet.schemas.errors import ArgumentValidationError, MalformedRequestError
from toolfleet.schemas.messages import ActionRequest
from toolfleet.schemas.tool import Tool

__all__ = [
    "Envelope",
    "ToolCallType",
    "custom_arguments",
    "custom_parameter",
    "decode_arguments",
    "normalize",
    "normalize_batch",
    "provider_kind",
    "tool_calls_in",
]

_PREVIEW_CHARS = 80
# Keys a toolfleet dict envelope may carry besides function and arguments.
_ID_KEYS = ("tool_call_id", "id")
# "custom": an OpenAI custom tool call (free-form text input); "function": any other call.
ToolCallType = Literal["function", "custom"]
# The item types that carry a tool call in a Responses API output list.
_RESPONSES_CALLS = ("function_call", "custom_tool_call")


@dataclass(frozen=True, slots=True)
class Envelope:
    """The function name and the arguments exactly as the caller proposed them.

    ``tool_call_id`` is the provider's id for the call (None: toolfleet generates one);
    ``arguments_error`` says why the proposed arguments could not be read; ``request`` is a
    toolfleet ActionRequest given as the envelope, which history then keeps as is;
    ``tool_call_type`` "custom" marks an OpenAI custom tool call, whose ``arguments`` are its
    free-form input text.
    """

    function: str
    arguments: Any
    tool_call_id: str | None = None
    arguments_error: str | None = None
    request: ActionRequest | None = None
    tool_call_type: ToolCallType = "function"
    # A LangGraph tool's resume values for its interrupt() calls (FleetToolNode sends them
    # under "graph_resume" beside "function" and "arguments"): never read from the arguments,
    # which a model writes, or a model could answer a tool's interrupt() itself.
    graph_resume: list[Any] | None = None


def normalize(request: Any) -> Envelope:
    """One call's envelope; MalformedRequestError (a ValueError) for any other shape."""
    if isinstance(request, ActionRequest):
        content = request.content
        return Envelope(
            content.function,
            dict(content.arguments),
            tool_call_id=content.tool_call_id or request.id,
            request=request,
        )
    if _is_lionagi_request(request):
        content = request.content
        return _checked(
            content.function, dict(content.arguments), request, tool_call_id=str(request.id)
        )
    if isinstance(request, BaseModel):
        fields = type(request).model_fields
        if "function" in fields and "arguments" in fields:
            tool_call_id = next(
                (getattr(request, k) for k in _ID_KEYS if k in fields and getattr(request, k)),
                None,
            )
            return _checked(
                request.function,  # type: ignore[attr-defined]
                request.arguments,  # type: ignore[attr-defined]
                request,
                tool_call_id=tool_call_id,
            )
        # The provider SDKs' objects are pydantic models of the provider's JSON.
        dumped = request.model_dump(mode="python", exclude_none=True)
        if provider_kind(dumped) is None:
            raise MalformedRequestError(
                f"action request model {type(request).__name__} declares "
                f"{sorted(fields)[:10]}, not both 'function' and 'arguments' and not a "
                "provider tool call; declare both fields or pass an ActionRequest"
            )
        return _from_mapping(dumped, request)
    if isinstance(request, Mapping):
        return _from_mapping(request, request)
    raise MalformedRequestError(
        f"action request must be an ActionRequest, a model or a dict with 'function' and "
        f"'arguments', or a provider tool call (OpenAI tool_calls entry, Responses "
        f"function_call or custom_tool_call, Anthropic tool_use), got "
        f"{type(request).__name__}: {_preview(request)}"
    )


def normalize_batch(
    requests: Any, *, suppress_errors: bool
) -> list[Envelope | MalformedRequestError]:
    """Every request of one act() in input order; a malformed one (or a second call with the
    same tool_call_id) is its MalformedRequestError, or raised when not ``suppress_errors``
    (before anything in the batch is enqueued)."""
    if not isinstance(requests, list | tuple):
        requests = [requests]
    items: list[Envelope | MalformedRequestError] = []
    seen: dict[str, int] = {}
    for index, request in enumerate(requests):
        try:
            item = normalize(request)
            if item.tool_call_id is not None:
                first = seen.setdefault(item.tool_call_id, index)
                if first != index:
                    # One id, one result: the provider could not pair two answers.
                    duplicate = MalformedRequestError(
                        f"tool_call_id {item.tool_call_id!r} of call {index} already names "
                        f"call {first} of this batch; give each call its own id"
                    )
                    duplicate.tool_call_id = item.tool_call_id
                    duplicate.tool_call_type = item.tool_call_type
                    raise duplicate
            items.append(item)
        except MalformedRequestError as exc:
            if not suppress_errors:
                raise
            items.append(exc)
    return items


def provider_kind(data: Mapping[str, Any]) -> str | None:
    """``openai``, ``openai-responses`` or ``anthropic`` for a provider tool-call dict (a
    custom tool call is ``openai`` or ``openai-responses`` too)."""
    kind = data.get("type")
    if kind in _RESPONSES_CALLS:
        return "openai-responses"
    if kind == "tool_use":
        return "anthropic"
    if isinstance(data.get("function"), Mapping) and kind in ("function", None):
        return "openai"
    if kind == "custom" and isinstance(data.get("custom"), Mapping):
        return "openai"
    return None


def _from_mapping(data: Mapping[str, Any], original: Any) -> Envelope:
    kind = provider_kind(data)
    if kind == "openai" and data.get("type") == "custom":
        custom = data["custom"]
        return _custom(custom.get("name"), custom.get("input"), original, data.get("id"))
    if kind == "openai":
        function = data["function"]
        return _checked(function.get("name"), function.get("arguments"), original, data.get("id"))
    if kind == "openai-responses" and data.get("type") == "custom_tool_call":
        return _custom(data.get("name"), data.get("input"), original, data.get("call_id"))
    if kind == "openai-responses":
        # call_id pairs the function_call_output; "id" is the item's own id (fc_...).
        return _checked(data.get("name"), data.get("arguments"), original, data.get("call_id"))
    if kind == "anthropic":
        return _checked(data.get("name"), data.get("input", {}), original, data.get("id"))
    if "function" in data and "arguments" in data:
        tool_call_id = next((data[k] for k in _ID_KEYS if data.get(k)), None)
        envelope = _checked(data["function"], data["arguments"], original, tool_call_id)
        resume = data.get("graph_resume")
        return replace(envelope, graph_resume=resume) if isinstance(resume, list) else envelope
    raise MalformedRequestError(
        f"action request dict has keys {safe_repr(list(data)[:10])}, not both "
        f"'function' and 'arguments' nor a provider tool call: {_preview(data)}; add the "
        "missing key"
    )


def _checked(function: Any, arguments: Any, request: Any, tool_call_id: Any = None) -> Envelope:
    _check_names(function, request, tool_call_id)
    decoded, problem = decode_arguments(function, arguments)
    return Envelope(function, decoded, tool_call_id=tool_call_id, arguments_error=problem)


def _custom(function: Any, text: Any, request: Any, tool_call_id: Any) -> Envelope:
    """A custom tool call: its input is text as it is (never decoded as JSON)."""
    try:
        _check_names(function, request, tool_call_id)
    except MalformedRequestError as exc:
        exc.tool_call_type = "custom"  # its error result answers a custom call
        raise
    problem = None
    if not isinstance(text, str):
        problem = (
            f"custom tool call input for tool {function!r} must be text, got "
            f"{type(text).__name__}: {_preview(text)}"
        )
    return Envelope(
        function, text, tool_call_id=tool_call_id, arguments_error=problem, tool_call_type="custom"
    )


def _check_names(function: Any, request: Any, tool_call_id: Any) -> None:
    if tool_call_id is not None and (not isinstance(tool_call_id, str) or not tool_call_id):
        raise MalformedRequestError(
            "action request tool call id must be a non-empty string, got "
            f"{safe_repr(tool_call_id)} in {_preview(request)}"
        )
    if not isinstance(function, str) or not function:
        error = MalformedRequestError(
            f"action request 'function' must be a non-empty tool name, got {safe_repr(function)} "
            f"in {_preview(request)}"
        )
        error.tool_call_id = tool_call_id
        raise error


def custom_parameter(tool: Tool) -> str | None:
    """The name of ``tool``'s one parameter when it takes exactly one, a free-form string (no
    ``enum``/``const``): the parameter a custom tool call's input goes to. None otherwise."""
    # Late: the schema code is only needed for a custom call.
    from toolfleet.workers.specs import parameters_schema

    try:
        properties = parameters_schema(tool).get("properties")
    except Exception:  # a schema pydantic cannot build: no string parameter to be sure of
        return None
    if not isinstance(properties, Mapping) or len(properties) != 1:
        return None
    [(name, schema)] = properties.items()
    if (
        not isinstance(schema, Mapping)
        or schema.get("type") != "string"
        or "enum" in schema
        or "const" in schema
    ):
        return None
    return str(name)


def custom_arguments(tool: Tool, text: str) -> dict[str, str]:
    """A custom tool call's arguments: its input ``text`` as ``tool``'s one string parameter;
    ArgumentValidationError when the tool does not take exactly one."""
    name = custom_parameter(tool)
    if name is None:
        raise ArgumentValidationError(
            f"tool {tool.function!r} cannot answer a custom tool call: its input is free-form "
            f"text, so the tool must take exactly one string parameter (it takes "
            f"{sorted(tool.required_fields)}); declare it to the model as a function tool, or "
            "give it one string parameter"
        )
    return {name: text}


def decode_arguments(function: str, arguments: Any) -> tuple[Any, str | None]:
    """``(arguments, None)`` with a JSON-string decoded; ``(raw, reason)`` if it cannot be."""
    if arguments is None:
        return {}, None
    if isinstance(arguments, bytes | bytearray):
        arguments = arguments.decode("utf-8", errors="replace")
    if not isinstance(arguments, str):
        return arguments, None
    if not arguments.strip():
        return {}, None  # some models send "" for a tool without parameters
    try:
        decoded = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return arguments, (
            f"arguments for tool {function!r} are a string that is not JSON ({exc.msg} at "
            f"column {exc.colno}): {_preview(arguments)}; the model must send a JSON object"
        )
    if not isinstance(decoded, dict):
        return arguments, (
            f"arguments for tool {function!r} are a JSON {type(decoded).__name__}, not a "
            f"JSON object: {_preview(arguments)}; the model must send an object of "
            "parameter names to values"
        )
    return decoded, None


def _is_lionagi_request(request: Any) -> bool:
    # Duck-typed on the module, so lionagi stays optional and is never imported here.
    module = type(request).__module__ or ""
    if not module.startswith("lionagi.") or type(request).__name__ != "ActionRequest":
        return False
    content = getattr(request, "content", None)
    return hasattr(content, "function") and hasattr(content, "arguments")


def _preview(value: Any) -> str:
    return safe_repr(value, _PREVIEW_CHARS)


def tool_calls_in(response: Any) -> list[Any]:
    """The tool calls of a whole model response, ready for ``Branch.act``.

    An OpenAI ``ChatCompletion`` (first choice) or its ``message``, an OpenAI Responses
    ``Response`` (its ``function_call`` and ``custom_tool_call`` items), an Anthropic
    ``Message`` (its ``tool_use`` blocks) — SDK objects or their dicts. Text parts are left
    out; no tool calls gives [].
    """
    data = response.model_dump(mode="python") if isinstance(response, BaseModel) else response
    if not isinstance(data, Mapping):
        raise MalformedRequestError(
            f"expected a model response (ChatCompletion, its message, a Responses Response or "
            f"an Anthropic Message), got {type(response).__name__}: {_preview(response)}"
        )
    return _picked(response, data)


def _picked(response: Any, data: Mapping[str, Any]) -> list[Any]:
    def items(name: str) -> list[Any]:
        value = getattr(response, name, None) if isinstance(response, BaseModel) else None
        if value is None:
            value = data.get(name)
        return list(value or [])

    if "choices" in data:  # ChatCompletion
        choices = items("choices")
        if not choices:
            return []
        first = choices[0]
        return tool_calls_in(first["message"] if isinstance(first, Mapping) else first.message)
    if "tool_calls" in data:  # a Chat Completions assistant message
        return items("tool_calls")
    if "output" in data:  # Responses API
        return [i for i in items("output") if _type(i) in _RESPONSES_CALLS]
    if "content" in data and isinstance(data.get("content"), list):  # Anthropic Message
        return [b for b in items("content") if _type(b) == "tool_use"]
    if data.get("role") == "assistant":  # a Chat message without tool calls
        return items("tool_calls")
    raise MalformedRequestError(
        f"no tool calls to read in {type(response).__name__} with keys "
        f"{sorted(map(str, data))[:10]}; pass a ChatCompletion, its message, a Responses "
        "Response or an Anthropic Message"
    )


def _type(item: Any) -> Any:
    return getattr(item, "type", None) if not isinstance(item, Mapping) else item.get("type")
