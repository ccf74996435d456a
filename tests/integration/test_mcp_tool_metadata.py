"""What ``toolfleet mcp`` announces about each tool and how it returns a structured output.

``tools/list`` carries each tool's annotations from its ``@tool`` flags and, for a return
annotation that is an object type, an ``outputSchema``; a dict output comes back as
``structuredContent`` too. The mcp package's own client runs the server over stdio against real
workers, and it checks every structuredContent against the announced outputSchema itself.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from tests.support.fleet import REPO_ROOT, private_workers
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.tool import Tool
from toolfleet.workers.specs import SPEC_FORMATS, tool_spec

TOOLS = ("tests.support.sample_tools", "tests.support.mcp_tools")


@pytest.fixture(scope="module")
def mcp_fleet(fleet_settings: Settings, redis_url: str) -> Iterator[dict[str, str]]:
    with private_workers(redis_url, "mcpmeta", tools=TOOLS, concurrency={"sync": 2}) as env:
        yield env


def _params(fleet_env: dict[str, str]) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFLEET_", "OTEL_"))}
    env.update(fleet_env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    script = Path(sys.executable).parent / "toolfleet"
    command, *prefix = [str(script)] if script.exists() else [sys.executable, "-m", "toolfleet.cli"]
    tools = [arg for module in TOOLS for arg in ("--tools", module)]
    return StdioServerParameters(
        command=command,
        args=[*prefix, "mcp", *tools, "--timeout-s", "60"],
        env=env,
        cwd=str(REPO_ROOT),
    )


def _hints(tool: types.Tool) -> dict[str, Any]:
    assert tool.annotations is not None, tool.name
    return tool.annotations.model_dump(by_alias=True, exclude_none=True)


def _text(result: types.CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, types.TextContent)
    return content.text


def test_tools_list_announces_the_tool_flags_as_annotations(mcp_fleet: dict[str, str]) -> None:
    async def main() -> dict[str, types.Tool]:
        with anyio.fail_after(60):
            async with Client(_params(mcp_fleet)) as client:
                return {t.name: t for t in (await client.list_tools()).tools}

    tools = anyio.run(main)
    assert _hints(tools["forecast"]) == {
        "readOnlyHint": True,
        "idempotentHint": False,
        "openWorldHint": True,
    }
    assert _hints(tools["read_note"]) == {
        "readOnlyHint": True,
        "idempotentHint": False,
        "openWorldHint": False,
    }
    assert _hints(tools["delete_note"]) == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": True,
    }
    assert _hints(tools["count_words"]) == {
        "readOnlyHint": False,
        "destructiveHint": False,
        "idempotentHint": False,
    }
    # No flag: what the protocol assumes of an unknown tool (destructive, open world) is left
    # to the client; idempotent=True alone becomes idempotentHint.
    assert _hints(tools["add"]) == {"readOnlyHint": False, "idempotentHint": False}
    assert _hints(tools["append_line_idempotent"])["idempotentHint"] is True

    # Announced in MCP tools/list only: the tool definitions for a model do not carry them.
    flagged = Tool(func_callable=_lookup, read_only=True, open_world=True, idempotent=True)
    for fmt in SPEC_FORMATS:
        spec = tool_spec(flagged, fmt)
        assert "Hint" not in json.dumps(spec) and "annotations" not in spec, fmt


def _lookup(key: str) -> str:
    return key


def test_a_dict_output_is_structured_content_with_its_output_schema(
    mcp_fleet: dict[str, str],
) -> None:
    async def main() -> tuple[dict[str, types.Tool], dict[str, types.CallToolResult]]:
        with anyio.fail_after(90):
            # The client validates each structuredContent against the tool's outputSchema
            # (it raises when one does not conform, or is missing).
            async with Client(_params(mcp_fleet)) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                calls: dict[str, dict[str, Any]] = {
                    "forecast": {"city": "Oslo"},
                    "read_note": {"name": "todo"},
                    "with_secret": {"query": "q", "api_key": "k" * 8},
                    "plain_dict": {"key": "k"},
                    "count_words": {"text": "one two three"},
                    "add": {"a": 1, "b": 2},
                    "misdeclared": {},
                }
                results = {name: await client.call_tool(name, args) for name, args in calls.items()}
                return tools, results

    tools, results = anyio.run(main)

    # Object return annotations: an object outputSchema.
    forecast = tools["forecast"].output_schema
    assert forecast is not None and forecast["type"] == "object"
    assert set(forecast["properties"]) == {"city", "celsius"}
    assert tools["read_note"].output_schema == {
        "type": "object",
        "additionalProperties": {"type": "string"},
    }
    assert tools["with_secret"].output_schema == {"type": "object", "additionalProperties": True}
    # No annotation, or not an object (no {"result": ...} wrapping): no outputSchema.
    for name in ("plain_dict", "count_words", "add", "fail", "echo"):
        assert tools[name].output_schema is None, name

    assert results["forecast"].structured_content == {"city": "Oslo", "celsius": 21.5}
    assert json.loads(_text(results["forecast"])) == {"city": "Oslo", "celsius": 21.5}
    assert results["read_note"].structured_content == {"name": "todo", "text": "the note todo"}
    assert results["with_secret"].structured_content == {"query": "q", "api_key_length": 8}
    assert results["plain_dict"].structured_content == {"k": 1}  # a dict, no schema
    for name in ("count_words", "add"):  # not dicts: text only
        assert results[name].structured_content is None, name
        assert not results[name].is_error
    assert json.loads(_text(results["count_words"])) == 3

    # An output its declared type does not describe is an error result, not a result that
    # breaks the announced schema.
    wrong = results["misdeclared"]
    assert wrong.is_error and wrong.structured_content is None
    assert "does not match its declared return type" in _text(wrong)
