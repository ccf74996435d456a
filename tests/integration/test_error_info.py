"""A failed call's result carries its error as structure (``error_info``) beside its text,
and the caller's side rebuilds the exception from it: against real workers of both pools."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.fleet import act_on, call, private_workers, run
from toolfleet import (
    ArgumentValidationError,
    ErrorInfo,
    RateLimitedError,
    ToolTimeoutError,
    rebuild_error,
)
from toolfleet.dispatcher import Fleet, Session
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

TOOLS = (
    "tests.support.sample_tools",
    "tests.support.limit_tools",
    "tests.support.error_tools",
)
ERRORS_MODULE = "toolfleet.schemas.errors"


@pytest.fixture(scope="module")
def workers(redis_url: str) -> Iterator[Settings]:
    with private_workers(redis_url, "error-info", tools=TOOLS) as env:
        yield Settings.from_env(env, tools=TOOLS)


def info_of(result: ActionResponseModel) -> ErrorInfo:
    assert result.error_info is not None, result
    # The text is the structure's own "Type: message", as it always was.
    assert result.error == f"{result.error_info.type}: {result.error_info.message}"
    return result.error_info


def test_a_tool_raising_value_error_on_either_pool(workers: Settings) -> None:
    results = act_on(
        workers, [call("fail", message="kaput 7"), call("fail_async", message="kaput 8")]
    )
    for result, text in zip(results, ("kaput 7", "kaput 8"), strict=True):
        assert result.status is EventStatus.FAILED
        info = info_of(result)
        assert info == ErrorInfo(type="ValueError", module="builtins", message=text, fields={})
        rebuilt = rebuild_error(info)
        assert type(rebuilt) is ValueError and str(rebuilt) == text


def test_a_tool_modules_own_exception_class(workers: Settings) -> None:
    (result,) = act_on(workers, [call("out_of_stock", item="anvil")])
    info = info_of(result)
    assert (info.type, info.module) == ("InventoryError", "tests.support.error_tools")
    assert info.message == "anvil is out of stock" and info.fields == {}
    # The dispatcher loaded the tool module, so the class itself comes back.
    from tests.support.error_tools import InventoryError

    rebuilt = rebuild_error(info)
    assert type(rebuilt) is InventoryError and str(rebuilt) == "anvil is out of stock"


@pytest.mark.parametrize("function", ["overruns_sync", "overruns_async"])
def test_a_tool_past_its_timeout(workers: Settings, function: str) -> None:
    (result,) = act_on(workers, [call(function, seconds=5)])
    assert result.status is EventStatus.FAILED
    info = info_of(result)
    assert (info.type, info.module) == ("ToolTimeoutError", ERRORS_MODULE)
    assert info.fields == {"timeout_s": 0.5}
    rebuilt = rebuild_error(info)
    assert isinstance(rebuilt, ToolTimeoutError) and rebuilt.timeout_s == 0.5


def test_a_straggler_the_dispatcher_gives_up_on(workers: Settings) -> None:
    (result,) = act_on(workers, [call("sleep_async", seconds=5)], CallParams(deadline_s=0.5))
    info = info_of(result)
    assert (info.type, info.module) == ("ToolTimeoutError", ERRORS_MODULE)
    assert info.fields == {"timeout_s": 0.5}


def test_an_argument_validation_failure_names_the_argument(workers: Settings) -> None:
    results = act_on(
        workers, [call("add", a="seven", b=1), call("add", a=1), call("add", a=1, b=2)]
    )
    wrong_type, missing, fine = results
    assert fine.status is EventStatus.COMPLETED and fine.error_info is None
    for result, argument in ((wrong_type, "a"), (missing, "b")):
        assert result.status is EventStatus.ABORTED
        info = info_of(result)
        assert (info.type, info.module) == ("ArgumentValidationError", ERRORS_MODULE)
        assert info.fields == {"argument": argument}
        rebuilt = rebuild_error(info)
        assert isinstance(rebuilt, ArgumentValidationError) and rebuilt.argument == argument


def test_a_rate_limited_call_says_when_to_retry(workers: Settings) -> None:
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    results = act_on(
        workers,
        [call("rated_slowly", tenant=tenant), call("rated_slowly", tenant=tenant)],
        CallParams(limit_wait_s=0),
    )
    assert [r.status for r in results] == [EventStatus.COMPLETED, EventStatus.FAILED]
    info = info_of(results[1])
    assert (info.type, info.module) == ("RateLimitedError", ERRORS_MODULE)
    retry_after_s = info.fields["retry_after_s"]
    assert 3500 < retry_after_s <= 3600, info
    rebuilt = rebuild_error(info)
    assert isinstance(rebuilt, RateLimitedError) and rebuilt.retry_after_s == retry_after_s


def test_a_gate_denial_is_no_error(workers: Settings) -> None:
    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        session = Session(fleet)
        session.gate(lambda invocation: invocation.function != "echo")
        return await session.new_branch().act([call("echo", value=1)])

    (result,) = run(workers, scenario)
    assert result.status is EventStatus.SKIPPED and result.error is not None
    assert result.error_info is None
