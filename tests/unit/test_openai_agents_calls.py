"""The caller's side of an Agents SDK call on the fleet, as pure logic: the model's arguments
read by the SDK's rules (the same errors as the SDK's own function tool, on the same input),
keys the schema does not name dropped, and outputs rebuilt to the declared return type."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from agents import RunContextWrapper, function_tool
from agents.exceptions import ModelBehaviorError
from agents.tool_context import ToolContext
from pydantic import BaseModel

from toolfleet.adapters.openai_agents_calls import (
    NOT_JSON,
    context_as_json,
    decode_arguments,
    rebuild_output,
    shape_of,
)


class Point(BaseModel):
    x: int
    y: int


@dataclasses.dataclass
class Size:
    width: float


def move(ctx: RunContextWrapper[Any], point: Point, steps: int = 1) -> Point:
    return Point(x=point.x + steps, y=point.y)


def spread(**options: int) -> tuple[int, ...]:
    return tuple(options.values())


def broken() -> ValueError:
    return ValueError("returned")


def _sdk_error(func: Any, text: str, **options: Any) -> str:
    """What the SDK's own function tool raises for ``text`` (no failure_error_function)."""
    sdk = function_tool(func, failure_error_function=None, **options)
    ctx = ToolContext(context=None, tool_name=sdk.name, tool_call_id="c1", tool_arguments=text)
    with pytest.raises(ModelBehaviorError) as raised:
        asyncio.run(sdk.on_invoke_tool(ctx, text))
    return str(raised.value)


@pytest.mark.parametrize(
    "text", ["{not json", "[1, 2]", '"text"', "{}", '{"point": {"x": "a", "y": 1}}', "  "]
)
def test_text_the_sdk_refuses_raises_its_model_behavior_error_with_its_message(text: str) -> None:
    shape = shape_of("move", move, strict=True, context_param="ctx")
    with pytest.raises(ModelBehaviorError) as raised:
        decode_arguments(shape, text)
    assert str(raised.value) == _sdk_error(move, text)


def test_keys_the_schema_does_not_name_are_dropped_the_context_parameters_name_among_them() -> None:
    shape = shape_of("move", move, strict=True, context_param="ctx")
    sent = '{"point": {"x": 1, "y": 2}, "ctx": "ADMIN_SECRET", "admin": true}'
    assert decode_arguments(shape, sent) == {"point": {"x": 1, "y": 2}}


def test_a_var_keyword_tool_refuses_flat_extra_keys_as_the_sdk_does() -> None:
    shape = shape_of("spread", spread, strict=False, context_param=None)
    assert decode_arguments(shape, '{"options": {"a": 1}}') == {"options": {"a": 1}}
    with pytest.raises(ModelBehaviorError) as raised:
        decode_arguments(shape, '{"a": 1}')
    assert str(raised.value) == _sdk_error(spread, '{"a": 1}', strict_mode=False)


def test_outputs_come_back_as_the_declared_type_and_stay_json_when_they_do_not_fit() -> None:
    moved = rebuild_output(
        shape_of("move", move, strict=True, context_param="ctx"), {"x": 2, "y": 2}
    )
    assert isinstance(moved, Point) and str(moved) == "x=2 y=2"
    assert rebuild_output(shape_of("move", move, strict=True, context_param="ctx"), "odd") == "odd"
    assert rebuild_output(shape_of("spread", spread, strict=False, context_param=None), [1, 2]) == (
        1,
        2,
    )
    error = rebuild_output(
        shape_of("broken", broken, strict=True, context_param=None),
        {"error": "ValueError", "message": "returned"},
    )
    assert isinstance(error, ValueError) and str(error) == "returned"


def test_a_context_travels_as_json_or_is_named_as_having_none() -> None:
    assert context_as_json({"user": "ada"}) == {"user": "ada"}
    assert context_as_json(Point(x=1, y=2)) == {"x": 1, "y": 2}
    assert context_as_json(Size(2.5)) == {"width": 2.5}
    assert context_as_json(None) is None
    assert context_as_json(object()) is NOT_JSON
    assert context_as_json({"nan": float("nan")}) is NOT_JSON
