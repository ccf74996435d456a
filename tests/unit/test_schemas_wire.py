"""Wire models, messages and act() result models (pure logic)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
import warnings

import pytest
from pydantic import ValidationError

from toolfleet.schemas import (
    REDACTED,
    ActionRequest,
    ActionRequestContent,
    ActionResponse,
    ActionResponseContent,
    ActionResponseModel,
    CallMessage,
    CallParams,
    CallResult,
    EventStatus,
    FunctionCalling,
    Tool,
    ToolInvocation,
)


def _divide(a: float, b: float, api_key: str = "") -> float:
    return a / b


# -- CallMessage / CallResult ------------------------------------------------------------


def test_call_message_round_trips_through_json() -> None:
    message = CallMessage(
        call_id=str(uuid.uuid4()),
        branch_id="branch-1",
        function="search",
        arguments={"q": "ünïcode ✓", "limit": 5, "filters": {"tags": ["a", None], "x": 1.5}},
        timeout_s=2.5,
        attempt=1,
        reply_to="toolfleet:reply:abc",
    )
    text = message.model_dump_json()
    assert CallMessage.model_validate_json(text) == message
    # Also through the stdlib json that kombu's serializer uses.
    assert CallMessage.model_validate(json.loads(json.dumps(message.model_dump()))) == message


def test_call_message_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="payload"):
        CallMessage.model_validate({"call_id": "c", "function": "f", "payload": 1})


def _finished_call(a: float, b: float) -> FunctionCalling:
    tool = Tool(func_callable=_divide, secret_args={"api_key"})
    fc = FunctionCalling(func_tool=tool, arguments={"a": a, "b": b, "api_key": "sk-live"})
    asyncio.run(fc.invoke())
    return fc


def test_call_result_round_trips_through_json_for_completed_call() -> None:
    fc = _finished_call(1, 4)
    result = CallResult(call_id=fc.id, function=fc.function, event=fc.to_dict(), worker="w1")
    rebuilt = CallResult.model_validate_json(result.model_dump_json())
    assert rebuilt == result
    assert rebuilt.status is EventStatus.COMPLETED
    assert rebuilt.execution["response"] == 0.25
    assert rebuilt.event["arguments"]["api_key"] == REDACTED
    assert "sk-live" not in result.model_dump_json()
    execution = rebuilt.to_execution()
    assert execution.status is EventStatus.COMPLETED
    assert execution.response == 0.25
    assert execution.duration == fc.execution.duration


def test_call_result_round_trips_through_json_for_failed_call() -> None:
    fc = _finished_call(1, 0)
    assert fc.status is EventStatus.FAILED
    result = CallResult(call_id=fc.id, function=fc.function, event=fc.to_dict())
    rebuilt = CallResult.model_validate(json.loads(result.model_dump_json()))
    assert rebuilt.status is EventStatus.FAILED
    assert rebuilt.execution["error"] == {
        "error": "ZeroDivisionError",
        "message": "division by zero",
        "module": "builtins",
    }
    assert rebuilt.to_execution().error == "ZeroDivisionError: division by zero"


@pytest.mark.parametrize(
    "event",
    [{}, {"execution": None}, {"execution": {"status": "done"}}, {"execution": {}}],
    ids=["no-execution", "execution-none", "unknown-status", "no-status"],
)
def test_call_result_rejects_event_without_valid_execution(event: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="event"):
        CallResult(call_id="c", function="f", event=event)


@pytest.mark.parametrize(("field", "value"), [("timeout_s", 0), ("timeout_s", -1), ("attempt", -1)])
def test_call_message_rejects_bad_numbers(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        CallMessage.model_validate({"call_id": "c", "function": "f", field: value})


# -- messages ----------------------------------------------------------------------------


def test_action_response_content_success_is_false_exactly_when_error_is_set() -> None:
    assert ActionResponseContent(function="f", output=None).success is True
    assert ActionResponseContent(function="f", output={"error": "in output"}).success is True
    assert ActionResponseContent(function="f", error="ValueError: bad").success is False
    assert ActionResponseContent(function="f", error="").success is False
    response = ActionResponse(content=ActionResponseContent(error="KeyError: 'x'"))
    assert response.success is False


def test_action_request_is_responded_once_linked() -> None:
    request = ActionRequest(content=ActionRequestContent(function="f", arguments={"a": 1}))
    assert request.is_responded() is False
    response = ActionResponse(
        content=ActionResponseContent(
            function=request.function,
            arguments=request.arguments,
            output=None,
            action_request_id=request.id,
        )
    )
    request.content.action_response_id = response.id
    assert request.is_responded() is True
    assert response.content.action_request_id == request.id
    assert request.id != response.id


def test_messages_round_trip_through_json() -> None:
    request = ActionRequest(
        sender="branch-1",
        recipient="tool-1",
        content=ActionRequestContent(function="f", arguments={"a": [1, 2]}),
    )
    assert ActionRequest.model_validate_json(request.model_dump_json()) == request
    response = ActionResponse(
        content=ActionResponseContent(function="f", output={"ok": True}, error=None)
    )
    assert ActionResponse.model_validate_json(response.model_dump_json()) == response


# -- act() result models -----------------------------------------------------------------


def test_action_response_model_carries_status_and_error() -> None:
    ok = ActionResponseModel(function="f", output=None)
    assert ok.status is EventStatus.COMPLETED
    assert ok.success is True
    failed = ActionResponseModel(
        function="f", status=EventStatus.FAILED, error="ZeroDivisionError: division by zero"
    )
    assert failed.success is False
    assert ActionResponseModel.model_validate_json(failed.model_dump_json()) == failed


def test_tool_invocation_is_frozen() -> None:
    invocation = ToolInvocation(function="f", arguments={"a": 1}, branch_id="b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        invocation.function = "g"  # type: ignore[misc]


def test_call_params_defaults() -> None:
    params = CallParams()
    assert params.retry_attempts == 0
    assert params.return_exceptions is False
    assert params.output_dropna is True
    assert params.timeout_s is None
    assert params.max_in_flight is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("retry_attempts", -1),
        ("retry_backoff", 0.5),
        ("timeout_s", 0),
        ("throttle_period_s", -1),
        ("max_in_flight", 0),
        ("bogus", 1),
    ],
)
def test_call_params_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        CallParams.model_validate({field: value})


def test_max_concurrent_is_the_in_flight_windows_old_name_still_accepted() -> None:
    """One name for the window (C8), Settings.max_in_flight's; ADR-0012 D4's name, max_concurrent,
    is an alias that works without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        params = CallParams(max_concurrent=8)
        assert CallParams.model_validate({"max_concurrent": 3}).max_in_flight == 3
    assert params.max_in_flight == 8 and params.max_concurrent == 8
    with pytest.raises(ValidationError, match="max_in_flight"):
        CallParams(max_concurrent=0)
    with pytest.raises(ValidationError, match="name the same window"):
        CallParams(max_concurrent=2, max_in_flight=4)
    assert "max_concurrent" not in CallParams.model_fields
