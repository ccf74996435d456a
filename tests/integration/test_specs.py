"""Tool specs from the registry (issue 14 item 4): JSON Schema from the signature or request
model, docstring description, secret arguments marked, three provider formats, and the
``toolfleet tools`` command. Schemas are checked against the JSON Schema metaschema and the
OpenAI/Anthropic SDK parameter types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from anthropic.types import ToolParam as AnthropicToolParam
from openai.types.chat import ChatCompletionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import BaseModel, ConfigDict, TypeAdapter

from tests.support.cli_support import toolfleet
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.workers.registry import Registry, tool
from toolfleet.workers.specs import SECRET_MARK, parameters_schema, tool_description


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
        TypeAdapter(FunctionToolParam).validate_python({**spec, "strict": False})
    anthropic_specs = reg.specs("anthropic", names=["whoami", "search"])
    assert [s["name"] for s in anthropic_specs] == ["whoami", "search"]
    for spec in anthropic_specs:
        TypeAdapter(AnthropicToolParam).validate_python(spec)
        assert spec["input_schema"]["type"] == "object"
    mcp = reg.specs("mcp")
    assert set(mcp[0]) == {"name", "description", "inputSchema"}


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
