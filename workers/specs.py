"""Tool specs for a model: the registry's tools as OpenAI, Anthropic or MCP tool definitions.

The parameters' JSON Schema comes from the tool's request model when it has one, else from
its callable's signature; the description from the docstring. Secret arguments stay in the
schema (the model must supply them) but are marked ``writeOnly`` and ``x-toolfleet-secret``,
so an agent framework can fill them itself instead of asking the model.

A Responses API definition says ``strict`` (which the SDK's ``FunctionToolParam`` requires):
true only for a schema OpenAI's strict mode takes as it is (:func:`openai_strict`). The
builders are typed with the SDKs' own TypedDicts, imported for the type checker only.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args, overload

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.tool import Tool

if TYPE_CHECKING:
    from anthropic.types import ToolParam as AnthropicToolParam
    from openai.types.chat import ChatCompletionFunctionToolParam
    from openai.types.responses import FunctionToolParam

__all__ = [
    "SECRET_MARK",
    "SPEC_FORMATS",
    "SpecFormat",
    "check_format",
    "openai_strict",
    "parameters_schema",
    "tool_description",
    "tool_spec",
    "tool_specs",
]

SpecFormat = Literal["openai", "openai-responses", "anthropic", "mcp"]
SPEC_FORMATS: tuple[str, ...] = get_args(SpecFormat)
# The JSON Schema extension keyword that marks a secret argument.
SECRET_MARK = "x-toolfleet-secret"

# Google/NumPy-style section headers that end a docstring's description.
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns|Return|Raises|Yields|Examples?)\s*:?\s*$"
)
_ARG_LINE = re.compile(r"^\s{0,8}\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def tool_description(tool: Tool) -> str:
    """The docstring up to its first ``Args:``/``Returns:`` section; the name when none."""
    doc = inspect.getdoc(tool.func_callable) or ""
    lines: list[str] = []
    for line in doc.splitlines():
        if _SECTION.match(line):
            break
        lines.append(line)
    text = "\n".join(lines).strip()
    return text or f"Run the tool {tool.function}."


def _argument_docs(tool: Tool) -> dict[str, str]:
    """Per-argument descriptions from a Google-style ``Args:`` section, if any."""
    doc = inspect.getdoc(tool.func_callable) or ""
    found: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in doc.splitlines():
        header = _SECTION.match(line)
        if header:
            in_args = header.group(1) in ("Args", "Arguments", "Parameters", "Params")
            current = None
            continue
        if not in_args:
            continue
        match = _ARG_LINE.match(line)
        if match and (len(line) - len(line.lstrip())) <= 8:
            current = match.group(1)
            found[current] = match.group(2).strip()
        elif current is not None and line.strip():
            found[current] = f"{found[current]} {line.strip()}".strip()
    return found


def parameters_schema(tool: Tool) -> dict[str, Any]:
    """The JSON Schema (an ``object``) of the arguments ``tool`` takes."""
    if tool.request_options is not None:
        schema = tool.request_options.model_json_schema()
    else:
        schema = tool.arguments_model.model_json_schema()
        # A **kwargs tool's model allows extra keys; the spec leaves them unmentioned, as
        # JSON Schema allows them by default.
        schema.pop("additionalProperties", None)
    schema.pop("title", None)
    # "type" first: the order a reader of `toolfleet tools` expects.
    schema = {"type": "object", **schema}
    properties: dict[str, Any] = schema.setdefault("properties", {})
    for prop in properties.values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    for name, text in _argument_docs(tool).items():
        prop = properties.get(name)
        if isinstance(prop, dict) and text and "description" not in prop:
            prop["description"] = text
    for name in sorted(tool.secret_args):
        prop = properties.get(name)
        if isinstance(prop, dict):
            prop["writeOnly"] = True
            prop[SECRET_MARK] = True
    if not tool.accepts_extra_arguments:
        schema["additionalProperties"] = False
    return schema


# A literal format picks its SDK type before the ``str`` fallback does (``mcp``, or a name
# known only at run time): the order decides, so the overlap mypy reports is intended.
@overload
def tool_spec(  # type: ignore[overload-overlap]
    tool: Tool, format: Literal["openai"] = ...
) -> ChatCompletionFunctionToolParam: ...
@overload
def tool_spec(  # type: ignore[overload-overlap]
    tool: Tool, format: Literal["openai-responses"]
) -> FunctionToolParam: ...
@overload
def tool_spec(  # type: ignore[overload-overlap]
    tool: Tool, format: Literal["anthropic"]
) -> AnthropicToolParam: ...
@overload
def tool_spec(tool: Tool, format: str) -> dict[str, Any]: ...
def tool_spec(tool: Tool, format: str = "openai") -> Any:
    """One tool's definition in ``format``: ``openai`` (Chat Completions), ``openai-responses``,
    ``anthropic`` or ``mcp``."""
    check_format(format)
    name = tool.function
    description = tool_description(tool)
    parameters = parameters_schema(tool)
    if format == "openai":
        return _openai(name, description, parameters)
    if format == "openai-responses":
        return _openai_responses(name, description, parameters)
    if format == "mcp":
        return {"name": name, "description": description, "inputSchema": parameters}
    return _anthropic(name, description, parameters)


@overload
def tool_specs(  # type: ignore[overload-overlap]
    tools: Iterable[Tool], format: Literal["openai"] = ...
) -> list[ChatCompletionFunctionToolParam]: ...
@overload
def tool_specs(  # type: ignore[overload-overlap]
    tools: Iterable[Tool], format: Literal["openai-responses"]
) -> list[FunctionToolParam]: ...
@overload
def tool_specs(  # type: ignore[overload-overlap]
    tools: Iterable[Tool], format: Literal["anthropic"]
) -> list[AnthropicToolParam]: ...
@overload
def tool_specs(tools: Iterable[Tool], format: str) -> list[dict[str, Any]]: ...
def tool_specs(tools: Iterable[Tool], format: str = "openai") -> list[Any]:
    """The definitions of ``tools`` in ``format``, in the order given."""
    check_format(format)
    return [tool_spec(t, format) for t in tools]


def _openai(
    name: str, description: str, parameters: dict[str, Any]
) -> ChatCompletionFunctionToolParam:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def _openai_responses(name: str, description: str, parameters: dict[str, Any]) -> FunctionToolParam:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": parameters,
        "strict": openai_strict(parameters),
    }


def _anthropic(name: str, description: str, parameters: dict[str, Any]) -> AnthropicToolParam:
    return {"name": name, "description": description, "input_schema": parameters}


# What OpenAI's strict mode is sure to take, kept narrow: a schema using any other keyword
# (a default, format, pattern or bound, toolfleet's secret marks, ...) is sent with strict
# false, which the API always accepts. Its size limits, the older (smaller) ones.
_STRICT_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "anyOf",
        "enum",
        "const",
        "description",
        "title",
    }
)
_STRICT_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
_STRICT_MAX_DEPTH = 5
_STRICT_MAX_PROPERTIES = 100
_STRICT_MAX_ENUM = 500


def openai_strict(schema: Mapping[str, Any]) -> bool:
    """Whether OpenAI's strict mode takes ``schema`` (a tool's parameters) as it is.

    True only when the root is an object, every object lists all its properties in
    ``required`` and has ``additionalProperties: false``, every array says its ``items``,
    and nothing else is used but types, ``anyOf``, ``enum``/``const``, descriptions, titles
    and non-recursive ``$ref`` into the root's ``$defs``, within the size limits. False
    whenever unsure: a strict tool the API refuses would fail the whole request.
    """
    if schema.get("type") != "object":
        return False
    defs = schema.get("$defs", {})
    if not isinstance(defs, Mapping):
        return False
    root = {k: v for k, v in schema.items() if k != "$defs"}
    counts = {"properties": 0}
    return _strict(root, defs, depth=1, refs=(), counts=counts)


def _strict(
    node: Any,
    defs: Mapping[str, Any],
    *,
    depth: int,
    refs: tuple[str, ...],
    counts: dict[str, int],
) -> bool:
    if not isinstance(node, Mapping) or not node or depth > _STRICT_MAX_DEPTH:
        return False  # {} is any JSON value: no strict schema says that
    if "$ref" in node:
        ref = node["$ref"]
        name = ref.removeprefix("#/$defs/") if isinstance(ref, str) else None
        if len(node) != 1 or name is None or name == ref or name in refs or name not in defs:
            return False  # siblings, another document, a recursion or a missing definition
        return _strict(defs[name], defs, depth=depth, refs=(*refs, name), counts=counts)
    if not set(node) <= _STRICT_KEYWORDS:
        return False
    if "anyOf" in node:
        variants = node["anyOf"]
        return (
            isinstance(variants, list)
            and bool(variants)
            and set(node) <= {"anyOf", "description", "title"}
            and all(_strict(v, defs, depth=depth, refs=refs, counts=counts) for v in variants)
        )
    if "enum" in node or "const" in node:
        values = node.get("enum", [node.get("const")])
        if not isinstance(values, list) or not values or len(values) > _STRICT_MAX_ENUM:
            return False
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not kinds or not set(kinds) <= _STRICT_TYPES:
        return False
    if "object" in kinds:
        properties = node.get("properties")
        required = node.get("required")
        if (
            not isinstance(properties, Mapping)
            or node.get("additionalProperties") is not False
            or not isinstance(required, list)
            or len(required) != len(properties)
            or set(required) != set(properties)
        ):
            return False
        counts["properties"] += len(properties)
        if counts["properties"] > _STRICT_MAX_PROPERTIES:
            return False
        if not all(
            _strict(p, defs, depth=depth + 1, refs=refs, counts=counts) for p in properties.values()
        ):
            return False
    elif "properties" in node or "required" in node or "additionalProperties" in node:
        return False
    if "array" in kinds:
        if not _strict(node.get("items"), defs, depth=depth + 1, refs=refs, counts=counts):
            return False
    elif "items" in node:
        return False
    return True


def check_format(format: str) -> str:
    """``format`` itself when it is one of SPEC_FORMATS; else a ConfigurationError."""
    if format not in SPEC_FORMATS:
        raise ConfigurationError(
            f"tool spec format {format!r} is not one of {list(SPEC_FORMATS)}; pass 'openai' "
            "for Chat Completions, 'openai-responses', 'anthropic' or 'mcp'"
        )
    return format
