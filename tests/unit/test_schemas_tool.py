"""Tool: kind detection, parameter sets, argument validation and secret redaction (pure logic)."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from toolfleet.schemas import (
    REDACTED,
    ArgumentValidationError,
    EventStatus,
    FunctionCalling,
    Tool,
    callable_kind,
    is_coro_func,
    normalize_arguments,
)


async def _async_fn(a: int, b: int = 0) -> int:
    return a + b


def _sync_fn(a: int, b: int = 0) -> int:
    return a + b


class _AsyncCallable:
    async def __call__(self, x: int) -> int:
        return x


class _SyncCallable:
    def __call__(self, x: int) -> int:
        return x


class _Service:
    async def fetch(self, url: str) -> str:
        return url

    def parse(self, text: str) -> str:
        return text


# -- kind detection ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("func", "kind"),
    [
        (_async_fn, "async"),
        (_sync_fn, "sync"),
        (functools.partial(_async_fn, 1), "async"),
        (functools.partial(_sync_fn, 1), "sync"),
        (functools.partial(functools.partial(_async_fn, 1), b=2), "async"),
        (functools.partial(functools.partial(functools.partial(_sync_fn), 1), b=2), "sync"),
        (_AsyncCallable(), "async"),
        (_SyncCallable(), "sync"),
        (functools.partial(_AsyncCallable(), 1), "async"),
        (_Service().fetch, "async"),
        (_Service().parse, "sync"),
        # A class with async __call__ is itself a sync constructor.
        (_AsyncCallable, "sync"),
        # Declaration decides, never the returned value: this lambda returns a coroutine.
        (lambda: _async_fn(1), "sync"),
    ],
    ids=[
        "async-def",
        "sync-def",
        "partial-async",
        "partial-sync",
        "nested-partial-async",
        "nested-partial-sync",
        "async-__call__-object",
        "sync-__call__-object",
        "partial-of-async-__call__-object",
        "bound-async-method",
        "bound-sync-method",
        "class-with-async-__call__",
        "lambda-returning-coroutine",
    ],
)
def test_kind_follows_declaration(func: Any, kind: str) -> None:
    assert callable_kind(func) == kind
    assert is_coro_func(func) is (kind == "async")
    assert Tool(func_callable=func).kind == kind


def test_nested_partial_async_tool_is_awaited_with_bound_arguments() -> None:
    tool = Tool(func_callable=functools.partial(functools.partial(_async_fn, 1)))
    fc = FunctionCalling(func_tool=tool, arguments={"b": 2})
    asyncio.run(fc.invoke())
    assert fc.status is EventStatus.COMPLETED, fc.execution.error
    assert fc.response == 3


def test_async_call_object_tool_is_awaited() -> None:
    fc = FunctionCalling(func_tool=Tool(func_callable=_AsyncCallable()), arguments={"x": 7})
    asyncio.run(fc.invoke())
    assert fc.status is EventStatus.COMPLETED, fc.execution.error
    assert fc.response == 7


def test_function_name_defaults_to_unwrapped_callable_name() -> None:
    assert Tool(func_callable=functools.partial(functools.partial(_sync_fn, 1))).function == (
        "_sync_fn"
    )
    assert Tool(func_callable=_AsyncCallable()).function == "_AsyncCallable"
    assert Tool(func_callable=_sync_fn, function="add").function == "add"


@pytest.mark.parametrize(("func", "kind"), [(_sync_fn, "async"), (_async_fn, "sync")])
def test_explicit_kind_contradicting_declaration_is_rejected(func: Any, kind: str) -> None:
    with pytest.raises(ValidationError, match=f"kind='{kind}' contradicts"):
        Tool(func_callable=func, kind=kind)
    assert Tool(func_callable=func, kind=callable_kind(func)).kind == callable_kind(func)


def test_non_callable_is_rejected_naming_the_value() -> None:
    with pytest.raises(ValidationError, match="func_callable must be a callable, got 42"):
        Tool(func_callable=42)


@pytest.mark.parametrize("timeout_s", [0, -1.5])
def test_non_positive_timeout_s_is_rejected(timeout_s: float) -> None:
    with pytest.raises(ValidationError, match=f"got {timeout_s}"):
        Tool(func_callable=_sync_fn, timeout_s=timeout_s)


def test_timeout_s_is_coerced_before_its_check() -> None:
    assert Tool(func_callable=_sync_fn, timeout_s="2.5").timeout_s == 2.5
    with pytest.raises(ValidationError, match="timeout_s"):
        Tool(func_callable=_sync_fn, timeout_s="soon")


def test_tool_is_frozen() -> None:
    tool = Tool(func_callable=_sync_fn)
    with pytest.raises(ValidationError):
        tool.strict = True  # type: ignore[misc]


# -- required_fields / minimum_acceptable_fields -----------------------------------------


def test_fields_from_signature() -> None:
    def tool(a: int, b: str, c: float = 1.0, *args: Any, d: int = 0, **kwargs: Any) -> None:
        return None

    t = Tool(func_callable=tool)
    assert t.required_fields == {"a", "b", "c", "d"}
    assert t.minimum_acceptable_fields == {"a", "b"}
    assert t.accepts_extra_arguments


def test_fields_from_request_options() -> None:
    class Request(BaseModel):
        query: str
        limit: int = 10

    t = Tool(func_callable=lambda **kw: kw, request_options=Request)
    assert t.required_fields == {"query", "limit"}
    assert t.minimum_acceptable_fields == {"query"}
    assert not t.accepts_extra_arguments


def test_strict_tool_needs_exactly_its_required_fields() -> None:
    t = Tool(func_callable=_sync_fn, strict=True)
    assert normalize_arguments(t, {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(ArgumentValidationError, match=r"exactly \['a', 'b'\], got \['a'\]"):
        normalize_arguments(t, {"a": 1})  # missing an optional one is still wrong when strict
    with pytest.raises(ArgumentValidationError, match=r"got \['a', 'b', 'z'\]"):
        normalize_arguments(t, {"a": 1, "b": 2, "z": 3})


def test_non_strict_tool_needs_at_least_its_minimum_fields() -> None:
    t = Tool(func_callable=_sync_fn)
    assert normalize_arguments(t, {"a": 1}) == {"a": 1}
    assert normalize_arguments(t, {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(ArgumentValidationError, match=r"missing required arguments \['a'\]"):
        normalize_arguments(t, {"b": 2})


def test_non_strict_tool_rejects_unknown_arguments_unless_it_takes_kwargs() -> None:
    with pytest.raises(ArgumentValidationError, match=r"unknown arguments \['zz'\]"):
        normalize_arguments(Tool(func_callable=_sync_fn), {"a": 1, "zz": 2})

    def open_tool(a: int, **extra: Any) -> None:
        return None

    assert normalize_arguments(Tool(func_callable=open_tool), {"a": 1, "zz": 2}) == {
        "a": 1,
        "zz": 2,
    }


def test_strict_tool_with_request_options_needs_exactly_its_fields() -> None:
    class Request(BaseModel):
        a: int
        b: int = 0

    t = Tool(func_callable=_sync_fn, request_options=Request, strict=True)
    assert normalize_arguments(t, {"a": "1", "b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(ArgumentValidationError, match="strict tool"):
        normalize_arguments(t, {"a": 1})
    with pytest.raises(ArgumentValidationError, match="strict tool"):
        normalize_arguments(t, {"a": 1, "b": 2, "smuggled": 3})


def test_non_strict_request_options_validation_runs() -> None:
    class Request(BaseModel):
        model_config = ConfigDict(extra="forbid")
        a: int

    t = Tool(func_callable=_sync_fn, request_options=Request)
    with pytest.raises(ArgumentValidationError, match=r"a: Field required"):
        normalize_arguments(t, {})
    with pytest.raises(ArgumentValidationError, match="x: Extra inputs are not permitted"):
        normalize_arguments(t, {"a": 1, "x": 2})


@pytest.mark.parametrize("arguments", [["a", 1], "a=1", None, 3])
def test_non_mapping_arguments_are_rejected_naming_the_type(arguments: Any) -> None:
    with pytest.raises(ArgumentValidationError, match=type(arguments).__name__):
        normalize_arguments(Tool(func_callable=_sync_fn), arguments)


def test_non_string_argument_names_are_rejected() -> None:
    with pytest.raises(ArgumentValidationError, match=r"must be strings, got \[1\]"):
        normalize_arguments(Tool(func_callable=lambda **kw: kw), {1: "x"})


def test_tool_given_as_dict_still_validates_arguments() -> None:
    with pytest.raises(ArgumentValidationError, match="missing required"):
        FunctionCalling(func_tool={"func_callable": _sync_fn}, arguments={})
    fc = FunctionCalling(func_tool={"func_callable": _sync_fn}, arguments={"a": 1})
    assert isinstance(fc.func_tool, Tool)


# -- request_options normalization -------------------------------------------------------


def test_request_options_normalization_dumps_model_input_exclude_unset() -> None:
    class Request(BaseModel):
        query: str
        limit: int = 10
        tags: list[str] = []

    received: list[dict[str, Any]] = []

    def search(**kwargs: Any) -> None:
        received.append(kwargs)

    tool = Tool(func_callable=search, request_options=Request)
    # Input is itself a Request with a default left unset and one set explicitly.
    fc = FunctionCalling(func_tool=tool, arguments=Request(query="x", tags=["a"]))
    assert fc.arguments == {"query": "x", "tags": ["a"]}
    asyncio.run(fc.invoke())
    assert received == [{"query": "x", "tags": ["a"]}]  # the tool applies its own default


def test_model_input_without_request_options_is_dumped_exclude_unset() -> None:
    class Given(BaseModel):
        a: int
        b: int = 5

    fc = FunctionCalling(func_tool=Tool(func_callable=_sync_fn), arguments=Given(a=1))
    assert fc.arguments == {"a": 1}


# -- secret arguments --------------------------------------------------------------------


def _login(user: str, password: str, token: str = "") -> str:
    return user


def test_secret_arguments_redacted_in_to_dict() -> None:
    tool = Tool(func_callable=_login, secret_args=["password", "token"])
    fc = FunctionCalling(
        func_tool=tool, arguments={"user": "ada", "password": "hunter2", "token": "t0k"}
    )
    asyncio.run(fc.invoke())
    data = fc.to_dict()
    assert data["function"] == "_login"
    assert data["arguments"] == {"user": "ada", "password": REDACTED, "token": REDACTED}
    text = json.dumps(data) + repr(fc) + str(fc)
    assert "hunter2" not in text and "t0k" not in text
    assert "func_tool" not in data  # the live tool is excluded from serialization
    # The call itself still received the real values.
    assert fc.arguments["password"] == "hunter2"
    assert fc.status is EventStatus.COMPLETED


def test_single_secret_arg_name_as_string_is_one_name() -> None:
    tool = Tool(func_callable=_login, secret_args="password")
    assert tool.secret_args == frozenset({"password"})
    fc = FunctionCalling(func_tool=tool, arguments={"user": "u", "password": "hunter2"})
    assert fc.to_dict()["arguments"]["password"] == REDACTED


def test_secret_value_not_echoed_by_validation_error() -> None:
    class Request(BaseModel):
        user: str
        password: int  # wrong type on purpose: the failing value is the secret

    tool = Tool(func_callable=_login, request_options=Request, secret_args={"password"})
    with pytest.raises(ArgumentValidationError) as info:
        FunctionCalling(func_tool=tool, arguments={"user": "u", "password": "hunter2"})
    assert "hunter2" not in str(info.value)
    assert info.value.__cause__ is None


def test_to_dict_survives_preprocessor_replacing_arguments_with_non_dict() -> None:
    tool = Tool(func_callable=_login, preprocessor=lambda arguments: ["not", "a", "dict"])
    fc = FunctionCalling(func_tool=tool, arguments={"user": "u", "password": "p"})
    asyncio.run(fc.invoke())
    assert fc.status is EventStatus.FAILED
    assert fc.to_dict()["arguments"] == ["not", "a", "dict"]
