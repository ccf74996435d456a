"""ADR-0012 D1 "Exact semantics": one test per rule, plus toolfleet's corrections (C6, timeout_s).

Pure logic: no Redis, no workers. Each test drives a real FunctionCalling through asyncio.run.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from toolfleet.schemas import (
    MAX_ERRORS,
    TERMINAL_STATUSES,
    UNSERIALIZABLE,
    ArgumentValidationError,
    Event,
    EventStatus,
    Execution,
    FunctionCalling,
    Tool,
    ToolTimeoutError,
)


def _call(func: Callable[..., Any], arguments: Any = None, **tool_fields: Any) -> FunctionCalling:
    tool = Tool(func_callable=func, **tool_fields)
    return FunctionCalling(func_tool=tool, arguments={} if arguments is None else arguments)


def _invoke(fc: FunctionCalling) -> FunctionCalling:
    asyncio.run(fc.invoke())
    return fc


class _Boom(Exception):
    pass


def _add(a: int, b: int) -> int:
    return a + b


# -- Construction ------------------------------------------------------------------------


class _AddRequest(BaseModel):
    a: int
    b: int = 10


def test_construction_dumps_model_input_with_exclude_unset_then_through_request_options() -> None:
    # The input model is a *different* class with a default the caller never set: the
    # default must not leak in (exclude_unset), and the request model must coerce "2" -> 2.
    class Incoming(BaseModel):
        a: str
        c: int = 99

    tool = Tool(func_callable=_add, request_options=_AddRequest)
    fc = FunctionCalling(func_tool=tool, arguments=Incoming(a="2"))
    assert fc.arguments == {"a": 2}
    assert "b" not in fc.arguments  # request_options dumped with exclude_unset too


def test_construction_validation_error_is_raised_not_captured() -> None:
    tool = Tool(func_callable=_add, request_options=_AddRequest)
    with pytest.raises(ArgumentValidationError) as info:
        FunctionCalling(func_tool=tool, arguments={"a": "not a number"})
    assert "'_add'" in str(info.value)
    assert "_AddRequest" in str(info.value)
    # A ValueError subclass: callers that catch ValueError for bad requests still work.
    assert isinstance(info.value, ValueError)

    with pytest.raises(ArgumentValidationError):
        FunctionCalling(func_tool=Tool(func_callable=_add), arguments={"a": 1})


# -- First invocation --------------------------------------------------------------------


def test_first_invocation_moves_pending_to_processing_and_keeps_created_at() -> None:
    seen: list[EventStatus] = []
    holder: list[FunctionCalling] = []

    def tool() -> str:
        seen.append(holder[0].status)
        return "ok"

    fc = _call(tool)
    holder.append(fc)
    created_at = fc.created_at
    assert fc.status is EventStatus.PENDING
    _invoke(fc)
    assert seen == [EventStatus.PROCESSING]
    assert fc.status is EventStatus.COMPLETED
    assert fc.created_at == created_at
    # The start sample is not a persisted execution field.
    assert set(fc.execution.to_dict()) == {"status", "duration", "response", "error", "retryable"}


# -- Preprocessor / callable / postprocessor ---------------------------------------------


def test_preprocessor_return_replaces_arguments() -> None:
    received: list[dict[str, Any]] = []

    def tool(**kwargs: Any) -> None:
        received.append(kwargs)

    def pre(arguments: dict[str, Any], *, suffix: str) -> dict[str, Any]:
        return {"replaced": arguments["x"] + suffix}

    fc = _call(tool, {"x": "a"}, preprocessor=pre, preprocessor_kwargs={"suffix": "!"})
    _invoke(fc)
    assert fc.status is EventStatus.COMPLETED
    assert received == [{"replaced": "a!"}]
    assert fc.arguments == {"replaced": "a!"}


def test_preprocessor_output_is_not_validated_again() -> None:
    received: list[Any] = []

    def tool(a: Any, b: Any = None) -> None:
        received.append(a)

    def pre(arguments: dict[str, Any]) -> dict[str, Any]:
        return {"a": "not an int"}  # would fail _AddRequest

    fc = FunctionCalling(
        func_tool=Tool(func_callable=tool, request_options=_AddRequest, preprocessor=pre),
        arguments={"a": 1},
    )
    _invoke(fc)
    assert fc.status is EventStatus.COMPLETED
    assert received == ["not an int"]


def test_callable_receives_arguments_as_keywords() -> None:
    def tool(*, left: int, right: int) -> int:  # keyword-only: positional passing would fail
        return left - right

    fc = _invoke(_call(tool, {"right": 1, "left": 10}))
    assert fc.status is EventStatus.COMPLETED
    assert fc.response == 9


def test_postprocessor_return_becomes_response() -> None:
    def post(response: int, *, factor: int) -> dict[str, int]:
        return {"scaled": response * factor}

    fc = _invoke(
        _call(_add, {"a": 1, "b": 2}, postprocessor=post, postprocessor_kwargs={"factor": 10})
    )
    assert fc.status is EventStatus.COMPLETED
    assert fc.response == {"scaled": 30}


def test_coroutine_declared_callable_and_processors_are_awaited() -> None:
    order: list[str] = []

    async def pre(arguments: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        order.append("pre")
        return {**arguments, "n": arguments["n"] + 1}

    async def tool(n: int) -> int:
        await asyncio.sleep(0)
        order.append("tool")
        return n * 2

    async def post(response: int) -> str:
        await asyncio.sleep(0)
        order.append("post")
        return f"result={response}"

    fc = _invoke(_call(tool, {"n": 1}, preprocessor=pre, postprocessor=post))
    assert fc.status is EventStatus.COMPLETED, fc.execution.error
    assert order == ["pre", "tool", "post"]
    assert fc.response == "result=4"


def test_sync_declared_callable_is_called_directly() -> None:
    threads: list[int] = []

    def tool() -> str:
        threads.append(threading.get_ident())
        return "plain value"

    fc = _invoke(_call(tool))
    assert fc.response == "plain value"
    # Called inline on the invoking thread: FunctionCalling adds no thread handoff; putting
    # sync tools off the caller's loop is the worker fleet's job (C6), not the event's.
    assert threads == [threading.get_ident()]


# -- C6: a sync declaration that returns an awaitable FAILS ------------------------------


async def _coro_value() -> str:
    return "never"


def _sync_returning_coroutine(**_: Any) -> Awaitable[str]:
    return _coro_value()


@pytest.mark.parametrize("role", ["callable", "preprocessor", "postprocessor"])
def test_sync_returning_awaitable_fails_with_type_error_naming_tool(role: str) -> None:
    fields: dict[str, Any] = {"function": "lookup_weather"}
    func: Callable[..., Any] = _sync_returning_coroutine
    if role == "preprocessor":
        fields["preprocessor"] = lambda arguments: _coro_value()
        func = _add
    elif role == "postprocessor":
        fields["postprocessor"] = lambda response: _coro_value()
        func = _add
    fc = _call(func, {"a": 1, "b": 2} if func is _add else {}, **fields)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _invoke(fc)
        gc.collect()  # an unclosed coroutine warns when it is finalized

    assert fc.status is EventStatus.FAILED
    assert fc.response is None
    error = fc.execution.error
    assert isinstance(error, TypeError)
    assert "'lookup_weather'" in str(error)
    assert role in str(error)
    never_awaited = [w for w in caught if "never awaited" in str(w.message)]
    assert never_awaited == []


def test_sync_returning_task_fails_and_cancels_the_task() -> None:
    tasks: list[asyncio.Task[None]] = []

    async def forever() -> None:
        await asyncio.sleep(3600)

    def tool() -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(forever())
        tasks.append(task)
        return task

    async def scenario() -> FunctionCalling:
        fc = _call(tool)
        await fc.invoke()
        await asyncio.sleep(0)  # let the cancellation be delivered
        return fc

    fc = asyncio.run(scenario())
    assert fc.status is EventStatus.FAILED
    assert isinstance(fc.execution.error, TypeError)
    assert tasks[0].cancelled()


# -- Terminal outcomes -------------------------------------------------------------------


def test_successful_completion_stores_response_completed_and_duration_in_seconds() -> None:
    async def tool() -> list[int]:
        await asyncio.sleep(0.05)
        return [1, 2]

    fc = _invoke(_call(tool))
    assert fc.status is EventStatus.COMPLETED
    assert fc.response == [1, 2]
    assert fc.execution.error is None
    duration = fc.execution.duration
    assert isinstance(duration, float)
    assert 0.05 <= duration < 5  # seconds, not milliseconds or nanoseconds


@pytest.mark.parametrize("stage", ["preprocessor", "callable", "postprocessor"])
def test_ordinary_exception_is_failed_captured_not_reraised(stage: str) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise _Boom(f"{stage} broke")

    fields: dict[str, Any] = {}
    func: Callable[..., Any] = _add
    if stage == "callable":
        func = boom
    else:
        fields[stage] = boom
    fc = _call(func, {"a": 1, "b": 2} if func is _add else {}, **fields)
    fc.execution.response = "pre-existing"

    _invoke(fc)  # does not raise

    assert fc.status is EventStatus.FAILED
    assert isinstance(fc.execution.error, _Boom)
    assert str(fc.execution.error) == f"{stage} broke"
    assert fc.response == "pre-existing"  # left unchanged, even by a failing postprocessor
    assert isinstance(fc.execution.duration, float)


class _Halt(BaseException):
    """A cancellation-class failure: a BaseException outside Exception."""


@pytest.mark.parametrize("exc_type", [asyncio.CancelledError, _Halt])
def test_cancellation_class_failure_is_cancelled_and_reraised(
    exc_type: type[BaseException],
) -> None:
    def tool() -> None:
        raise exc_type("stop")

    fc = _call(tool)
    with pytest.raises(exc_type):
        _invoke(fc)
    assert fc.status is EventStatus.CANCELLED
    assert isinstance(fc.execution.error, exc_type)
    assert isinstance(fc.execution.duration, float)


def test_task_cancellation_during_call_is_cancelled_and_propagates() -> None:
    async def scenario() -> FunctionCalling:
        running = asyncio.Event()

        async def tool() -> None:
            running.set()
            await asyncio.sleep(3600)

        fc = _call(tool)
        task = asyncio.create_task(fc.invoke())
        await asyncio.wait_for(running.wait(), timeout=5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return fc

    fc = asyncio.run(scenario())
    assert fc.status is EventStatus.CANCELLED
    assert isinstance(fc.execution.error, asyncio.CancelledError)


@pytest.mark.parametrize(
    "status", [s for s in EventStatus if s is not EventStatus.PENDING], ids=lambda s: s.value
)
def test_repeated_invocation_does_not_run_again(status: EventStatus) -> None:
    calls: list[int] = []

    def tool() -> int:
        calls.append(1)
        return len(calls)

    fc = _call(tool)
    if status is EventStatus.COMPLETED:
        _invoke(fc)  # really completed once
        assert calls == [1]
    else:
        fc.status = status
    before = fc.execution.to_dict()
    _invoke(fc)
    assert fc.status is status
    assert fc.execution.to_dict() == before
    assert calls == ([1] if status is EventStatus.COMPLETED else [])


def test_failed_call_is_not_executed_again() -> None:
    calls: list[int] = []

    def tool() -> None:
        calls.append(1)
        raise _Boom("once")

    fc = _invoke(_call(tool))
    _invoke(fc)
    assert calls == [1]
    assert fc.status is EventStatus.FAILED
    assert isinstance(fc.execution.error, _Boom)  # not folded into a group by a re-run


# -- completion_event --------------------------------------------------------------------


@pytest.mark.parametrize("status", sorted(TERMINAL_STATUSES), ids=lambda s: s.value)
def test_terminal_status_sets_completion_event(status: EventStatus) -> None:
    async def scenario() -> None:
        event = Event()
        waiter = asyncio.create_task(event.completion_event.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        event.status = EventStatus.PROCESSING
        await asyncio.sleep(0)
        assert not event.completion_event.is_set()
        event.status = status
        await asyncio.wait_for(waiter, timeout=5)

    asyncio.run(scenario())


def test_completion_event_created_after_event_finished_is_already_set() -> None:
    fc = _invoke(_call(_add, {"a": 1, "b": 1}))
    assert fc._completion_event is None  # lazily created: nobody asked for it yet
    assert fc.completion_event.is_set()
    assert fc.completion_event is fc.completion_event


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_completion_event_set_by_invoke(outcome: str) -> None:
    def tool() -> int:
        if outcome == "failed":
            raise _Boom("x")
        return 1

    async def scenario() -> FunctionCalling:
        fc = _call(tool)
        waiter = asyncio.create_task(fc.completion_event.wait())
        await fc.invoke()
        await asyncio.wait_for(waiter, timeout=5)
        return fc

    assert asyncio.run(scenario()).status.value == outcome


def test_completion_event_set_on_cancellation() -> None:
    async def scenario() -> FunctionCalling:
        def tool() -> None:
            raise asyncio.CancelledError

        fc = _call(tool)
        completion = fc.completion_event
        with pytest.raises(asyncio.CancelledError):
            await fc.invoke()
        assert completion.is_set()
        return fc

    assert asyncio.run(scenario()).status is EventStatus.CANCELLED


def test_status_setter_accepts_plain_string_and_signals_completion() -> None:
    event = Event()
    completion = event.completion_event
    event.status = "completed"  # type: ignore[assignment]
    assert event.status is EventStatus.COMPLETED
    assert completion.is_set()


# -- Error accumulation and serialization ------------------------------------------------


def test_error_group_capped_at_100() -> None:
    execution = Execution()
    for i in range(MAX_ERRORS + 50):
        execution.add_error(ValueError(f"e{i}"))
    group = execution.error
    assert isinstance(group, ExceptionGroup)
    assert len(group.exceptions) == MAX_ERRORS == 100
    # The newest are kept: the last failures explain the final state.
    assert str(group.exceptions[-1]) == f"e{MAX_ERRORS + 49}"
    assert str(group.exceptions[0]) == "e50"
    serialized = execution.to_dict()["error"]
    assert len(serialized["exceptions"]) == 100


def test_first_error_is_stored_as_is_and_second_makes_a_group() -> None:
    execution = Execution()
    first = _Boom("first")
    execution.add_error(first)
    assert execution.error is first
    execution.add_error(KeyError("second"))
    assert isinstance(execution.error, ExceptionGroup)
    assert [type(e) for e in execution.error.exceptions] == [_Boom, KeyError]


def test_serialized_tool_raised_group_is_capped_at_100() -> None:
    def tool() -> None:
        raise ExceptionGroup("many", [ValueError(str(i)) for i in range(250)])

    fc = _invoke(_call(tool))
    error = fc.execution.to_dict()["error"]
    assert error["error"] == "ExceptionGroup"
    assert "250 sub-exceptions" in error["message"]  # the count survives the cap
    assert len(error["exceptions"]) == MAX_ERRORS


def test_exception_serializes_as_error_and_message() -> None:
    def tool() -> None:
        raise _Boom("disk full on /var")

    fc = _invoke(_call(tool))
    data = fc.to_dict()
    assert data["execution"]["error"] == {
        "error": "_Boom",
        "message": "disk full on /var",
        "module": __name__,
    }
    assert data["execution"]["status"] == "failed"
    json.dumps(data)


def test_exception_with_broken_str_still_serializes() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    execution = Execution(status=EventStatus.FAILED, error=Unprintable())
    assert execution.to_dict()["error"] == {
        "error": "Unprintable",
        "message": "<unprintable Unprintable>",
        "module": __name__,
        "qualname": "test_exception_with_broken_str_still_serializes.<locals>.Unprintable",
    }


def test_unserializable_response_becomes_marker() -> None:
    def tool() -> dict[str, Any]:
        return {"ok": [1, 2], "handle": threading.Lock()}

    fc = _invoke(_call(tool))
    assert fc.status is EventStatus.COMPLETED
    data = fc.to_dict()
    assert data["execution"]["response"] == UNSERIALIZABLE
    json.dumps(data)


# -- toolfleet: timeout_s ----------------------------------------------------------------


def test_timeout_s_makes_failed_tool_timeout_error() -> None:
    async def slow() -> None:
        await asyncio.sleep(3600)

    fc = _call(slow, timeout_s=0.05)
    assert fc.timeout_s == 0.05  # inherited from the tool
    _invoke(fc)
    assert fc.status is EventStatus.FAILED
    assert isinstance(fc.execution.error, ToolTimeoutError)
    assert "'slow'" in str(fc.execution.error)
    assert "timeout_s=0.05" in str(fc.execution.error)
    assert fc.execution.duration is not None and fc.execution.duration < 5


def test_call_timeout_s_overrides_tool_timeout_s() -> None:
    async def slow() -> str:
        await asyncio.sleep(0.2)
        return "done"

    fc = FunctionCalling(func_tool=Tool(func_callable=slow, timeout_s=0.01), timeout_s=30)
    _invoke(fc)
    assert fc.status is EventStatus.COMPLETED
    assert fc.response == "done"


def test_timeout_error_raised_by_tool_is_not_reported_as_deadline() -> None:
    async def tool() -> None:
        raise TimeoutError("upstream API timed out")

    fc = _invoke(_call(tool, timeout_s=30))
    error = fc.execution.error
    assert fc.status is EventStatus.FAILED
    assert type(error) is TimeoutError
    assert str(error) == "upstream API timed out"
