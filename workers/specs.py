"""Tool specs for a model: the registry's tools as OpenAI, Anthropic or MCP tool definitions.

The parameters' JSON Schema comes from the tool's request model when it has one, else from
its callable's signature; the description from the docstring. Secret arguments stay in the
schema (the model must supply them) but are marked ``writeOnly`` and ``x-toolfleet-secret``,
so an agent framework can fill them itself instead of asking the model.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from typing import Any, Literal, get_args

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.tool import Tool

__all__ = [
    "SECRET_MARK",
    "SPEC_FORMATS",
    "SpecFormat",
    "check_format",
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


def tool_spec(tool: Tool, format: str = "openai") -> dict[str, Any]:
    """One tool's definition in ``format``: ``openai`` (Chat Completions), ``openai-responses``,
    ``anthropic`` or ``mcp``."""
    check_format(format)
    name = tool.function
    description = tool_description(tool)
    parameters = parameters_schema(tool)
    if format == "openai":
        return {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }
    if format == "openai-responses":
        return {
            "type": "function",
            "name": name,
            "description": description,
            "parameters": parameters,
        }
    if format == "mcp":
        return {"name": name, "description": description, "inputSchema": parameters}
    return {"name": name, "description": description, "input_schema": parameters}  # anthropic


def tool_specs(tools: Iterable[Tool], format: str = "openai") -> list[dict[str, Any]]:
    """The definitions of ``tools`` in ``format``, in the order given."""
    check_format(format)
    return [tool_spec(t, format) for t in tools]


def check_format(format: str) -> str:
    """``format`` itself when it is one of SPEC_FORMATS; else a ConfigurationError."""
    if format not in SPEC_FORMATS:
        raise ConfigurationError(
            f"tool spec format {format!r} is not one of {list(SPEC_FORMATS)}; pass 'openai' "
            "for Chat Completions, 'openai-responses', 'anthropic' or 'mcp'"
        )
    return format
