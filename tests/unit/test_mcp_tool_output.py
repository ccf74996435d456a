"""Which return annotations give a tool an MCP ``outputSchema`` (an object type only), and the
``@tool`` effect flags on the Tool model."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

pytest.importorskip("mcp")

from toolfleet.adapters.mcp import tool_annotations, tool_output
from toolfleet.schemas.tool import Tool
from toolfleet.workers.registry import Registry, tool


class Node(BaseModel):
    name: str
    children: list[Node] = []


@dataclasses.dataclass
class Point:
    x: float
    y: float


def _returns(annotation: Any) -> Tool:
    def f() -> Any:
        return None

    f.__annotations__["return"] = annotation
    return Tool(func_callable=f)


@pytest.mark.parametrize("annotation", [dict, dict[str, int], Node, Point])
def test_an_object_return_type_has_an_object_output_schema(annotation: Any) -> None:
    output = tool_output(_returns(annotation))
    assert output is not None and output.schema["type"] == "object"


@pytest.mark.parametrize(
    "annotation", [int, str, list[int], dict[str, int] | None, Any, None, "NotDefinedAnywhere"]
)
def test_any_other_return_type_has_none(annotation: Any) -> None:
    assert tool_output(_returns(annotation)) is None


def test_a_recursive_model_is_inlined_at_the_root() -> None:
    output = tool_output(_returns(Node))
    assert output is not None
    assert "$ref" not in output.schema and set(output.schema["properties"]) == {"name", "children"}
    assert output.dump({"name": "a", "children": [{"name": "b"}]}) == {
        "name": "a",
        "children": [{"name": "b", "children": []}],
    }
    with pytest.raises(ValidationError):
        output.dump({"children": []})


def test_the_postprocessor_return_type_is_the_output() -> None:
    def f() -> int:
        return 1

    def post(value: int) -> dict[str, int]:
        return {"value": value}

    assert tool_output(Tool(func_callable=f)) is None
    output = tool_output(Tool(func_callable=f, postprocessor=post))
    assert output is not None and output.schema["type"] == "object"


def test_the_effect_flags_reach_the_tool_and_its_annotations() -> None:
    local = Registry()

    @tool(read_only=True, open_world=False, registry=local)
    def lookup(key: str) -> str:
        return key

    @tool(destructive=True, idempotent=True, registry=local)
    def drop(key: str) -> None:
        return None

    looked = local.get("lookup")
    assert (looked.read_only, looked.destructive, looked.open_world) == (True, None, False)
    hints = tool_annotations(looked)
    assert (hints.read_only_hint, hints.destructive_hint, hints.open_world_hint) == (
        True,
        None,
        False,
    )
    dropped = tool_annotations(local.get("drop"))
    assert (dropped.read_only_hint, dropped.destructive_hint, dropped.idempotent_hint) == (
        False,
        True,
        True,
    )


def test_read_only_and_destructive_together_are_refused() -> None:
    def f() -> None:
        return None

    with pytest.raises(ValidationError, match="both read_only=True and destructive=True"):
        Tool(func_callable=f, read_only=True, destructive=True)
