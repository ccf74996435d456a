"""How the Pydantic AI adapter reads a fleet result (``answer``), for the outcomes the
integration tests cannot provoke cheaply: a lost or cancelled call, a broker refusal, an
argument refusal on the worker, an error class this process cannot import. Pure logic: the
results are built here as the dispatcher builds them."""

from __future__ import annotations

import pytest
from pydantic_ai import ModelRetry
from pydantic_ai.exceptions import CallDeferred, ToolFailed
from pydantic_ai.tools import ToolDenied

from toolfleet.adapters.pydantic_ai import ToolfleetToolError, answer
from toolfleet.schemas import ErrorInfo
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.errors import (
    ArgumentValidationError,
    BrokerError,
    RemoteToolError,
    WorkerLostError,
)
from toolfleet.schemas.status import EventStatus


def failed(error: BaseException, status: EventStatus = EventStatus.FAILED) -> ActionResponseModel:
    info = ErrorInfo.of(error)
    return ActionResponseModel(
        function="tool", status=status, error=info.text, error_info=info, call_id="c1"
    )


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (WorkerLostError("the worker died"), EventStatus.FAILED),
        (BrokerError("no broker"), EventStatus.ABORTED),
        (RuntimeError("stopped"), EventStatus.CANCELLED),
    ],
)
def test_a_failure_of_the_fleet_ends_the_run_as_a_toolfleet_error(
    error: BaseException, status: EventStatus
) -> None:
    with pytest.raises(ToolfleetToolError) as raised:
        answer(failed(error, status))
    assert raised.value.result.status is status


def test_a_call_without_error_info_is_a_denial_when_skipped_and_a_fleet_failure_otherwise() -> None:
    denied = ActionResponseModel(
        function="tool", status=EventStatus.SKIPPED, error="denied by governance gate"
    )
    assert answer(denied) == ToolDenied("denied by governance gate")
    with pytest.raises(ToolfleetToolError):
        answer(ActionResponseModel(function="tool", status=EventStatus.CANCELLED, error="x"))


def test_argument_refusals_retry_and_deferrals_and_unknown_classes_keep_their_meaning() -> None:
    with pytest.raises(ModelRetry, match="argument 'a'"):
        answer(failed(ArgumentValidationError("argument 'a' expects int"), EventStatus.ABORTED))
    with pytest.raises(CallDeferred):
        answer(failed(CallDeferred(metadata={"ignored": True})))
    info = ErrorInfo(type="QuotaError", module="billing.errors", message="over quota")
    remote = ActionResponseModel(
        function="tool", status=EventStatus.FAILED, error=info.text, error_info=info
    )
    with pytest.raises(RemoteToolError) as raised:
        answer(remote)
    assert "over quota" in str(raised.value)
    # As a result instead, on request: the text the model reads (C1).
    with pytest.raises(ToolFailed) as as_result:
        answer(remote, tool_errors_as_results=True)
    assert as_result.value.message == "QuotaError: over quota"
