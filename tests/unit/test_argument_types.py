"""Arguments are checked against the schema the tool publishes: the model built from the
signature both makes the specs and validates each call (pure logic: no Redis, no worker)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from toolfleet.schemas.errors import ArgumentValidationError
from toolfleet.schemas.function_calling import normalize_arguments
from toolfleet.schemas.tool import Tool
from toolfleet.workers.specs import parameters_schema


def add(a: int, b: int = 0) -> int:
    return a + b


def shout(text: str, **options: Any) -> str:
    return text


def when(at: datetime.datetime, note=None) -> str:  # type: ignore[no-untyped-def]
    return at.isoformat()


def login(user: str, password: str) -> bool:
    return True


def test_the_published_schema_is_the_one_that_validates() -> None:
    tool = Tool(func_callable=add)
    assert parameters_schema(tool)["properties"]["a"]["type"] == "integer"
    assert tool.arguments_model.model_json_schema()["properties"]["a"]["type"] == "integer"
    with pytest.raises(ArgumentValidationError) as refused:
        normalize_arguments(tool, {"a": "x", "b": 1})
    message = str(refused.value)
    assert "argument 'a' expects int, got 'x'" in message
    assert "toolfleet tools" in message  # says where to read the schema


def test_lax_conversions_are_pydantics_and_strict_tools_are_strict() -> None:
    assert normalize_arguments(Tool(func_callable=add), {"a": "5", "b": 2}) == {"a": 5, "b": 2}
    with pytest.raises(ArgumentValidationError, match="argument 'a' expects int, got '5'"):
        normalize_arguments(Tool(func_callable=add, strict=True), {"a": "5", "b": 2})


def test_a_converted_value_is_sent_as_json() -> None:
    tool = Tool(func_callable=when)
    sent = normalize_arguments(tool, {"at": datetime.datetime(2026, 12, 4, 17, 0)})
    assert sent == {"at": "2026-12-04T17:00:00"}
    # An untyped argument keeps its value: the wire check, not validation, judges it.
    assert normalize_arguments(tool, {"at": "2026-12-04T17:00:00", "note": {1}})["note"] == {1}


def test_extra_arguments_of_a_kwargs_tool_are_kept_and_typed_ones_checked() -> None:
    tool = Tool(func_callable=shout)
    assert normalize_arguments(tool, {"text": "hi", "loud": True}) == {"text": "hi", "loud": True}
    with pytest.raises(ArgumentValidationError, match="argument 'text' expects str, got 12345"):
        normalize_arguments(tool, {"text": 12345})


def test_the_refused_value_is_cut_to_200_characters_and_a_secret_is_never_shown() -> None:
    with pytest.raises(ArgumentValidationError) as refused:
        normalize_arguments(Tool(func_callable=add), {"a": "y" * 5000})
    message = str(refused.value)
    assert "y" * 200 in message and "y" * 201 not in message
    assert "(5,000 characters)" in message
    tool = Tool(func_callable=login, secret_args={"password"})
    with pytest.raises(ArgumentValidationError) as refused:
        normalize_arguments(tool, {"user": "ann", "password": ["hunter2"]})
    assert "hunter2" not in str(refused.value) and "argument 'password'" in str(refused.value)
