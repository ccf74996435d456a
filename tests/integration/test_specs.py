"""Tool specs from the registry: JSON Schema from the signature or request
model, docstring description, secret arguments marked, three provider formats, and the
``toolfleet tools`` command. Schemas are checked against the JSON Schema metaschema and the
OpenAI/Anthropic SDK parameter types."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Literal

import jsonschema
import pytest
from anthropic.types import ToolParam as AnthropicToolParam
from openai.types.chat import ChatCompletionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from tests.support.cli_support import toolfleet
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.workers.registry import Registry, registry, tool
from toolfleet.workers.specs import (
    SECRET_MARK,
    openai_strict,
    parameters_schema,
    tool_description,
)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str
    limit: int = 10


def _registry() -> Registry:
    reg = Registry()

    @tool(registry=reg, secret_args=("token",))
    def whoami(token: str, verbose: bool = False, tags: list[str] | None = None) -> str:
        """Say whose API token this is.

        Args:
            token: the caller's API token
            verbose: also print the
                token's scopes
        Returns:
            the owner's name
        """
        return "alice"

    @tool(registry=reg, request_options=SearchRequest)
    async def search(**kwargs: Any) -> list[str]:
        """Search the catalogue."""
        return []

    class Opaque:
        pass

    @tool(registry=reg)
    def anything(value, thing: Opaque | None = None, **extra):  # type: ignore[no-untyped-def]
        return value

    return reg


def test_signature_schema_types_defaults_required_and_docs() -> None:
    schema = parameters_schema(_registry().get("whoami"))
    assert schema["type"] == "object"
    assert schema["required"] == ["token"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["verbose"] == {
        "type": "boolean",
        "default": False,
        "description": "also print the token's scopes",
    }
    assert props["tags"]["default"] is None
    assert {"type": "array", "items": {"type": "string"}} in props["tags"]["anyOf"]
    # secret: still a parameter (the tool needs it), but marked for the agent framework
    assert props["token"]["type"] == "string"
    assert props["token"]["writeOnly"] is True
    assert props["token"][SECRET_MARK] is True
    assert props["token"]["description"] == "the caller's API token"
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({"token": "sk-1", "tags": ["a"]})
    assert not validator.is_valid({"verbose": True})  # token missing
    assert not validator.is_valid({"token": "sk-1", "colour": "red"})  # unknown argument


def test_request_model_schema_and_description() -> None:
    reg = _registry()
    schema = parameters_schema(reg.get("search"))
    assert schema["properties"] == {
        "query": {"type": "string"},
        "limit": {"type": "integer", "default": 10},
    }
    assert schema["required"] == ["query"]
    assert schema["additionalProperties"] is False
    assert tool_description(reg.get("search")) == "Search the catalogue."
    assert tool_description(reg.get("whoami")) == "Say whose API token this is."


def test_unannotated_and_unschemable_parameters_take_any_json() -> None:
    schema = parameters_schema(_registry().get("anything"))
    assert schema["required"] == ["value"]
    assert "additionalProperties" not in schema  # **extra: unknown keys are fine
    assert tool_description(_registry().get("anything")) == "Run the tool anything."
    jsonschema.Draft202012Validator.check_schema(schema)
    assert jsonschema.Draft202012Validator(schema).is_valid({"value": {"x": [1]}, "y": 2})


def test_formats_match_the_sdk_types() -> None:
    reg = _registry()
    openai_specs = reg.specs("openai")
    assert [s["function"]["name"] for s in openai_specs] == ["anything", "search", "whoami"]
    for spec in openai_specs:
        TypeAdapter(ChatCompletionToolParam).validate_python(spec)
    for spec in reg.specs("openai-responses"):
        TypeAdapter(FunctionToolParam).validate_python(spec)
    anthropic_specs = reg.specs("anthropic", names=["whoami", "search"])
    assert [s["name"] for s in anthropic_specs] == ["whoami", "search"]
    for spec in anthropic_specs:
        TypeAdapter(AnthropicToolParam).validate_python(spec)
        assert spec["input_schema"]["type"] == "object"
    mcp = reg.specs("mcp")
    assert set(mcp[0]) == {"name", "description", "inputSchema"}


class Point(BaseModel):
    model_config = ConfigDict(extra="forbid")

    x: int
    y: int


class LoosePoint(BaseModel):  # unknown keys allowed: no additionalProperties false
    x: int


def _strict_registry() -> Registry:
    reg = Registry()

    @tool(registry=reg)
    def move(to: Point, unit: Literal["m", "cm"], note: str | None, steps: list[int]) -> str:
        """Every parameter required, every object closed: strict mode takes it."""
        return ""

    @tool(registry=reg)
    def shout(text: str) -> str:
        return text

    @tool(registry=reg)
    def nudge(to: LoosePoint) -> str:
        return ""

    @tool(registry=reg)
    def page(query: str, size: int = 10) -> str:  # size not required
        return ""

    @tool(registry=reg)
    def stamp(text: str, **extra: Any) -> str:  # any other key accepted
        return ""

    return reg


def test_every_responses_spec_is_a_valid_function_tool_param_with_strict() -> None:
    sample = importlib.import_module("tests.support.sample_tools")
    specs = [
        *registry.specs("openai-responses", names=sample.__all__),
        *_registry().specs("openai-responses"),
        *_strict_registry().specs("openai-responses"),
    ]
    adapter = TypeAdapter(FunctionToolParam)
    for spec in specs:
        adapter.validate_python(spec)  # every key the SDK requires, of its type
        assert isinstance(spec["strict"], bool)
        with pytest.raises(ValidationError, match="strict"):
            adapter.validate_python({k: v for k, v in spec.items() if k != "strict"})
    strict = {spec["name"]: spec["strict"] for spec in specs}
    assert {name for name, on in strict.items() if on} == {
        "add",  # two required numbers
        "loaded_modules",
        "loaded_modules_async",
        "move",  # a closed nested model by $ref, a literal, a nullable, an array
        "shout",
        "sleep_async",
        "sleep_sync",
        "blocks_loop",
        "append_line",
        "append_line_idempotent",
        "append_then_sleep",
    }
    # Not: a default (echo, fail, page, search), a secret's marks (with_secret), an open
    # nested model (nudge), **extra (stamp), a parameter of any JSON value (anything), no
    # "required" list at all (returns_none: no parameters; unsure, so not strict).
    for name in ("echo", "fail", "page", "search", "with_secret", "nudge", "stamp", "anything"):
        assert strict[name] is False, name
    assert strict["returns_none"] is False
    # Chat Completions specs are unchanged: strict is optional there and left out.
    assert "strict" not in _strict_registry().specs("openai")[0]["function"]


def _closed(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    """An object schema with every property required and no other key allowed."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
        **more,
    }


def _nested(objects: int) -> dict[str, Any]:
    """A string inside ``objects`` closed objects, one in the other."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(objects):
        schema = _closed({"x": schema})
    return schema


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (_closed({}), True),
        ({"type": "object", "properties": {}, "additionalProperties": False}, False),
        (_closed({"a": {}}), False),
        (_closed({"a": {"type": "string", "format": "email"}}), False),
        (_closed({"a": {"type": "string", "default": "x"}}), False),
        (_closed({"a": {"type": "array"}}), False),
        (_closed({"a": {"type": ["string", "null"]}}), True),
        (_closed({"a": {"$ref": "#/$defs/A"}}, **{"$defs": {"A": {"type": "string"}}}), True),
        (
            _closed({"a": {"$ref": "#/$defs/A", "description": "d"}}, **{"$defs": {"A": {}}}),
            False,
        ),
        (
            _closed(
                {"a": {"$ref": "#/$defs/A"}},
                **{"$defs": {"A": _closed({"a": {"$ref": "#/$defs/A"}})}},
            ),
            False,
        ),
        (_nested(4), True),
        (_nested(5), False),
        ({"anyOf": [{"type": "object"}]}, False),
    ],
    ids=[
        "empty",
        "no-required",
        "any-value",
        "format",
        "default",
        "no-items",
        "type-list",
        "ref",
        "ref-sibling",
        "recursive",
        "depth-5",
        "depth-6",
        "root-anyof",
    ],
)
def test_openai_strict_is_false_whenever_unsure(schema: dict[str, Any], expected: bool) -> None:
    assert openai_strict(schema) is expected


def test_bad_format_and_unknown_name_are_clear_errors() -> None:
    reg = _registry()
    with pytest.raises(ConfigurationError, match=r"format 'gemini' is not one of"):
        reg.specs("gemini")
    with pytest.raises(LookupError, match=r"no tool named 'nope'"):
        reg.specs("openai", names=["nope"])


@pytest.mark.parametrize(
    ("fmt", "schema_path"),
    [
        ("openai", ("function", "parameters")),
        ("anthropic", ("input_schema",)),
        ("mcp", ("inputSchema",)),
    ],
)
def test_cli_prints_valid_specs(fmt: str, schema_path: tuple[str, ...], tmp_path: Path) -> None:
    done = toolfleet(
        "tools",
        "--tools",
        "tests.support.sample_tools",
        "--format",
        fmt,
        home=tmp_path,
        timeout_s=60,
    )
    assert done.returncode == 0, done.stderr
    specs = json.loads(done.stdout)
    by_name: dict[str, Any] = {}
    for spec in specs:
        schema: Any = spec
        for key in schema_path:
            schema = schema[key]
        jsonschema.Draft202012Validator.check_schema(schema)
        name = spec["function"]["name"] if fmt == "openai" else spec["name"]
        by_name[name] = schema
    assert {"add", "echo", "with_secret"} <= set(by_name)
    assert by_name["add"]["required"] == ["a", "b"]
    assert by_name["add"]["properties"]["a"]["type"] == "number"


def test_cli_without_modules_or_with_unknown_name_exits_2(tmp_path: Path) -> None:
    done = toolfleet("tools", home=tmp_path, timeout_s=60)
    assert done.returncode == 2
    assert "no tool modules" in done.stderr
    done = toolfleet(
        "tools",
        "--tools",
        "tests.support.sample_tools",
        "--name",
        "nope",
        home=tmp_path,
        timeout_s=60,
    )
    assert done.returncode == 2
    assert "no tool named 'nope'" in done.stderr
