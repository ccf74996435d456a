"""A fleet call's result as Pydantic AI takes a local tool's outcome (:func:`answer`).

Read by type, never by splitting error text: the result's ``error_info`` is rebuilt on this
side (``toolfleet.schemas.rebuild_error``), so a ``ModelRetry`` raised on a worker is
``ModelRetry`` here, and a tool's ``ValueError`` is a ``ValueError``.

- the tool returned: its output (a JSON object or list rebuilt as the function's return type);
- it raised ``ModelRetry`` or ``ToolFailed``: that exception (a retry prompt, a failed result);
- it raised ``ApprovalRequired`` or ``CallDeferred``: that exception (the call is deferred);
- it outran its ``timeout_s``: ``ModelRetry("Timed out after N seconds.")``, as a local tool;
- the dispatcher or the worker refused its arguments: ``ModelRetry`` with the refusal;
- it raised anything else: that exception, rebuilt by type (``tool_errors_as_results=True``:
  ``ToolFailed`` with its text, which the model reads);
- a gate or an approver denied it: ``ToolDenied`` (the model reads the denial, outcome
  ``denied``); a TOOL_PRE hook refused it (C3): ``ToolFailed`` with the refusal;
- lost, cancelled, or aborted by the broker: :class:`ToolfleetToolError`, ending the run.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_ai import ModelRetry
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ToolFailed
from pydantic_ai.tools import ToolDenied

from toolfleet.schemas import ErrorInfo, rebuild_error
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.errors import (
    ApprovalDeniedError,
    ArgumentValidationError,
    BrokerError,
    CallError,
    CallLostError,
    DispatcherLostError,
    NoWorkerError,
    ToolTimeoutError,
    WorkerLostError,
)
from toolfleet.schemas.status import EventStatus

__all__ = ["ToolfleetToolError", "answer"]

# Failures of the fleet itself, not of the tool: the run cannot go on as if the tool had run.
_FLEET_FAILURES = (BrokerError, CallLostError, DispatcherLostError, NoWorkerError, WorkerLostError)


class ToolfleetToolError(CallError, RuntimeError):
    """Raised when a fleet call ended without the tool's own outcome (lost, cancelled, the
    broker gone); ``result`` is the call's toolfleet result."""

    def __init__(self, result: ActionResponseModel) -> None:
        super().__init__(f"tool {result.function!r} ({result.status.value}): {result.error}")
        self.result = result


def answer(
    result: ActionResponseModel,
    *,
    returns: TypeAdapter[Any] | None = None,
    tool_errors_as_results: bool = False,
) -> Any:
    """What a local tool's call would have given Pydantic AI: the output, or the exception
    (see the module's table). ``returns``: the function's return type, to rebuild a JSON
    object or list as it."""
    if result.status is EventStatus.COMPLETED and result.error is None:
        return _rebuilt_output(result.output, returns)
    info = result.error_info
    if info is None:
        if result.status is EventStatus.SKIPPED:  # a gate's denial (D2)
            return ToolDenied(result.error or "denied by the fleet's gate")
        raise ToolfleetToolError(result)
    error = _rebuilt(info)
    if isinstance(error, ModelRetry | ToolFailed):
        raise error
    if isinstance(error, ApprovalRequired | CallDeferred):
        raise type(error)()  # the framework defers the call: approval or an external result
    if isinstance(error, ApprovalDeniedError):
        return ToolDenied(info.message)
    if isinstance(error, ArgumentValidationError):
        raise ModelRetry(info.message)
    if isinstance(error, ToolTimeoutError):
        timeout_s = info.fields.get("timeout_s")
        raise ModelRetry(f"Timed out after {timeout_s} seconds." if timeout_s else info.message)
    if isinstance(error, _FLEET_FAILURES) or result.status is EventStatus.CANCELLED:
        raise ToolfleetToolError(result) from error
    if result.status is EventStatus.ABORTED:  # refused before it ran: a TOOL_PRE hook (C3)
        raise ToolFailed(result.error or info.text)
    if tool_errors_as_results:
        raise ToolFailed(result.error or info.text)
    error.add_note(
        f"raised by tool {result.function!r} on a toolfleet worker (call {result.call_id})"
    )
    raise error


def _rebuilt(info: ErrorInfo) -> BaseException:
    # Pydantic AI's deferral exceptions take metadata, not a message: rebuilt by name here.
    if info.module == "pydantic_ai.exceptions" and info.type == "ApprovalRequired":
        return ApprovalRequired()
    if info.module == "pydantic_ai.exceptions" and info.type == "CallDeferred":
        return CallDeferred()
    return rebuild_error(info)


def _rebuilt_output(output: Any, returns: TypeAdapter[Any] | None) -> Any:
    """A JSON object or list as the function's declared return type (a pydantic model, a
    dataclass, ...), as a local tool returns it; anything else as it came."""
    if returns is None or not isinstance(output, dict | list):
        return output
    try:
        return returns.validate_python(output)
    except ValidationError:
        return output
