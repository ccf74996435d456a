"""Bad input at the schema layer (D1): pure logic, property-based.

Whatever an agent sends, argument normalization either returns a dict or raises the one
specific error (ArgumentValidationError naming the tool), and serialization of a result never
raises. A secret value in a bad call is never echoed by the error message.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError

from toolfleet.schemas import (
    UNSERIALIZABLE,
    ArgumentValidationError,
    CallMessage,
    FunctionCalling,
    Tool,
    normalize_arguments,
    to_jsonable,
)

MARKER = "S3CRET-MARKER-7f1c"

# Every JSON-able scalar plus the values that are not JSON.
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
non_json_values = st.one_of(
    st.binary(max_size=10),
    st.sets(st.integers(), max_size=3),
    st.just(float("nan")),
    st.just(float("inf")),
    st.just(float("-inf")),
    st.builds(object),
    st.just(lambda: None),
    st.just(Ellipsis),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
)
any_values = st.recursive(
    st.one_of(json_scalars, non_json_values),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=8), children, max_size=4),
        st.tuples(children, children),
    ),
    max_leaves=20,
)


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str
    limit: int = 10
    api_key: str | None = None


def search(query: str, limit: int = 10, api_key: str | None = None) -> list[str]:
    return [query] * limit


def echo(text: str) -> str:
    return text


SEARCH = Tool(func_callable=search, request_options=Query, secret_args=("api_key",))
ECHO = Tool(func_callable=echo)
STRICT_ECHO = Tool(func_callable=echo, function="strict_echo", strict=True)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=any_values.filter(lambda v: not isinstance(v, dict)))
def test_non_dict_arguments_are_rejected_naming_the_tool(arguments: Any) -> None:
    with pytest.raises(ArgumentValidationError) as info:
        normalize_arguments(ECHO, arguments)
    assert "'echo'" in str(info.value)
    assert "must be a dict" in str(info.value)


@settings(max_examples=60)
@given(
    # Lax pydantic accepts bytes for a str field, so bytes are not a wrong type here.
    query=any_values.filter(lambda v: not isinstance(v, (str, bytes))),
    limit=any_values,
)
def test_wrong_types_for_a_request_model_fail_alone_with_a_specific_error(
    query: Any, limit: Any
) -> None:
    arguments = {"query": query, "limit": limit, "api_key": MARKER}
    with pytest.raises(ArgumentValidationError) as info:
        normalize_arguments(SEARCH, arguments)
    text = str(info.value)
    assert "'search'" in text and "Query" in text
    # The error names the field at fault, and never repeats the secret value.
    assert "query" in text
    assert MARKER not in text


@settings(max_examples=50)
@given(
    extra=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: k != "text"), any_values, min_size=1
    )
)
def test_unknown_argument_names_are_named_in_the_error(extra: dict[str, Any]) -> None:
    with pytest.raises(ArgumentValidationError) as info:
        normalize_arguments(ECHO, {"text": "x", **extra})
    assert "unknown arguments" in str(info.value)
    with pytest.raises(ArgumentValidationError) as strict_info:
        normalize_arguments(STRICT_ECHO, {"text": "x", **extra})
    assert "strict tool 'strict_echo'" in str(strict_info.value)


@given(keys=st.lists(st.one_of(st.integers(), st.binary(max_size=4)), min_size=1, max_size=3))
def test_non_string_argument_names_are_rejected(keys: list[Any]) -> None:
    with pytest.raises(ArgumentValidationError, match="argument names for tool 'echo'"):
        normalize_arguments(ECHO, {"text": "x", **{k: 1 for k in keys}})


def test_a_missing_required_argument_is_named() -> None:
    with pytest.raises(ArgumentValidationError, match=r"missing required arguments \['text'\]"):
        normalize_arguments(ECHO, {})


@settings(max_examples=80)
@given(value=any_values)
def test_serializing_any_value_never_raises_and_yields_strict_json(value: Any) -> None:
    converted = to_jsonable(value)
    # allow_nan=False: NaN/inf would be invalid JSON on the wire.
    json.dumps(converted, allow_nan=False)


@given(value=non_json_values)
def test_a_non_json_value_becomes_the_unserializable_marker(value: Any) -> None:
    if isinstance(value, (set, frozenset)):
        # Sets of JSON scalars have a faithful JSON form (a sorted list).
        assert to_jsonable(value) == sorted(value)
        return
    assert to_jsonable(value) == UNSERIALIZABLE
    assert to_jsonable({"ok": 1, "bad": [value]}) == UNSERIALIZABLE


@pytest.mark.parametrize("depth", [150, 1_000, 50_000])
def test_deeply_nested_payloads_are_refused_without_a_recursion_crash(depth: int) -> None:
    nested: Any = "leaf"
    for _ in range(depth):
        nested = [nested]
    assert to_jsonable(nested) == UNSERIALIZABLE


def test_a_moderately_nested_payload_survives_serialization() -> None:
    nested: Any = "leaf"
    for _ in range(50):
        nested = {"k": nested}
    assert json.loads(json.dumps(to_jsonable(nested))) == nested


@settings(max_examples=60)
@given(
    payload=st.dictionaries(
        st.sampled_from(
            ["call_id", "function", "arguments", "attempt", "timeout_s", "reply_to", "evil"]
        ),
        any_values,
    )
)
def test_a_wire_message_of_any_shape_validates_or_raises_validation_error(
    payload: dict[str, Any],
) -> None:
    try:
        message = CallMessage.model_validate(payload)
    except ValidationError:
        return
    assert "evil" not in payload
    assert isinstance(message.call_id, str) and isinstance(message.function, str)
    assert isinstance(message.arguments, dict)


def test_a_bad_call_fails_at_construction_not_at_invoke() -> None:
    # Construction errors are raised (ADR-0012 D1), so a worker can record them as the call's
    # own failure without running anything.
    with pytest.raises(ArgumentValidationError):
        FunctionCalling(func_tool=SEARCH, arguments={"query": 3.5, "api_key": MARKER})


def test_a_secret_never_reaches_the_event_record() -> None:
    call = FunctionCalling(
        func_tool=SEARCH, arguments={"query": "q", "limit": 1, "api_key": MARKER}
    )
    asyncio.run(call.invoke())
    assert call.response == ["q"]
    record = json.dumps(call.to_dict())
    assert MARKER not in record
    assert call.to_dict()["arguments"]["api_key"] == "***"


def test_nesting_limit_names_the_argument_and_survives_self_reference() -> None:
    from toolfleet.dispatcher.accept.nesting import MAX_ARGUMENT_DEPTH, check_nesting

    ok: Any = "leaf"
    for _ in range(MAX_ARGUMENT_DEPTH):
        ok = [ok]
    check_nesting("echo", {"value": ok})  # exactly at the limit: accepted
    with pytest.raises(ArgumentValidationError, match=r"argument 'value' of tool 'echo'"):
        check_nesting("echo", {"value": [ok]})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ArgumentValidationError, match="nested more than"):
        check_nesting("echo", {"cycle": loop})
