"""What one call leaves behind, as a history ``Unit``: its event records, its linked
ActionRequest/ActionResponse pair, the result act() returns and its TOOL_POST/TOOL_ERROR payload.

Four outcomes, four builders: a call that reached a worker (:func:`finished_unit`), one a
gate denied (:func:`denied_unit`, D2), one its approver denied (:func:`unapproved_unit`), one
stopped before it was enqueued (:func:`aborted_unit`, C3). Each builds the same facts three
ways (history pair, returned model, hook payload), so they never disagree.
"""

from __future__ import annotations

from typing import Any

from toolfleet.dispatcher.accept.context import CallContext
from toolfleet.dispatcher.govern.hooks import HookPoint
from toolfleet.dispatcher.history.history import Unit, link_pair
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.error_info import ErrorInfo
from toolfleet.schemas.errors import ApprovalDeniedError
from toolfleet.schemas.messages import ActionRequest, ActionResponse
from toolfleet.schemas.record import EventRecord, bounded_arguments
from toolfleet.schemas.serialize import format_error
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallResult

__all__ = [
    "DENIED_OUTPUT_ERROR",
    "HOOK_SUMMARY_CHARS",
    "aborted_unit",
    "denied_unit",
    "finished_unit",
    "history_record",
    "unapproved_unit",
]

DENIED_OUTPUT_ERROR = "denied by governance gate"
# The ADR's observability budget for hook summaries.
HOOK_SUMMARY_CHARS = 200


def history_record(ctx: CallContext, result: CallResult) -> EventRecord:
    """The worker's record of one attempt as the branch history keeps it (with the call's
    approval decision, when it waited for one)."""
    record = EventRecord.from_dict(result.event).in_history(
        call_id=ctx.call_id,
        tool_call_id=ctx.tool_call_id,
        branch_id=ctx.branch_id,
        attempt=result.attempt,
        worker=result.worker,
    )
    if ctx.approval is not None:
        record.approval = ctx.approval
    return record


def finished_unit(ctx: CallContext, result: CallResult, events: list[EventRecord]) -> Unit:
    """A call with a terminal record (from a worker, or settled by the dispatcher)."""
    execution = result.to_execution()
    status = execution.status
    output = execution.response
    error = None if status is EventStatus.COMPLETED else _error_text(execution.error, status)
    info = None if error is None else ErrorInfo.from_record(result.execution.get("error"))
    request, response, model = _answer(ctx, ctx.public_arguments, output, status, error, info)
    return Unit(
        call_id=ctx.call_id,
        events=events,
        request=request,
        response=response,
        result=model,
        hook_point=HookPoint.TOOL_POST,
        hook_payload={
            "call_id": ctx.call_id,
            "tool_name": ctx.function,
            "response": str(output)[:HOOK_SUMMARY_CHARS],
            "duration": execution.duration,
            "status": status,
            "error": error,
            "error_info": info,
            "branch_id": ctx.branch_id,
        },
    )


def denied_unit(ctx: CallContext) -> Unit:
    """A call the session's gate denied: a value whatever suppress_errors says; no event, no
    hook (D2)."""
    output = {"error": DENIED_OUTPUT_ERROR, "function": ctx.function}
    request, response, model = _answer(
        ctx, ctx.public_arguments, output, EventStatus.SKIPPED, DENIED_OUTPUT_ERROR, None
    )
    return Unit(ctx.call_id, [], request, response, model)


def unapproved_unit(ctx: CallContext, refusal: str) -> Unit:
    """A call parked for approval that was denied or not decided in time: not run, a value
    the model reads (``refusal``: who said no and why) whatever suppress_errors says, like a
    gate's denial (D2), and one SKIPPED record holding the decision."""
    output = {"error": refusal, "function": ctx.function}
    denial = ApprovalDeniedError(refusal)
    record = EventRecord.not_run(
        ctx.function,
        ctx.public_arguments,
        denial,
        status=EventStatus.SKIPPED,
        secret_args=ctx.secret_args,
        tool_call_id=ctx.tool_call_id,
        duration_s=None,
    ).in_history(
        call_id=ctx.call_id,
        tool_call_id=ctx.tool_call_id,
        branch_id=ctx.branch_id,
        attempt=0,
        worker=None,
    )
    record.approval = ctx.approval
    request, response, model = _answer(
        ctx, ctx.public_arguments, output, EventStatus.SKIPPED, refusal, ErrorInfo.of(denial)
    )
    return Unit(ctx.call_id, [record], request, response, model)


def aborted_unit(
    ctx: CallContext,
    exc: BaseException,
    *,
    raise_after: bool,
    hook: bool = True,
    events: list[EventRecord] | None = None,
) -> Unit:
    """A call stopped before (or while) enqueuing: ABORTED event, error pair (C3).

    ``events`` are the records of earlier attempts; ``raise_after`` makes act() raise ``exc``
    once the unit is written (suppress_errors=False); ``hook`` emits TOOL_ERROR.
    """
    error = format_error(exc)
    # Refused before enqueue: a preview of its arguments, never a refused payload whole.
    arguments = bounded_arguments(ctx.public_arguments)
    output = {"error": error, "function": ctx.function, "arguments": arguments}
    record = EventRecord.not_run(
        ctx.function,
        arguments,
        exc,
        status=EventStatus.ABORTED,
        secret_args=ctx.secret_args,
        duration_s=None,  # never enqueued: no duration at all
    ).in_history(
        call_id=ctx.call_id,
        tool_call_id=ctx.tool_call_id,
        branch_id=ctx.branch_id,
        attempt=len(events or ()),
        worker=None,
    )
    request, response, model = _answer(
        ctx, arguments, output, EventStatus.ABORTED, error, ErrorInfo.of(exc)
    )
    return Unit(
        call_id=ctx.call_id,
        events=[*(events or ()), record],
        request=request,
        response=response,
        result=model,
        raise_after=exc if raise_after else None,
        hook_point=HookPoint.TOOL_ERROR if hook else None,
        hook_payload={
            "call_id": ctx.call_id,
            "tool_name": ctx.function,
            "error": exc,
            "duration": None,
            "branch_id": ctx.branch_id,
        },
    )


def _error_text(error: str | BaseException | None, status: EventStatus) -> str:
    if error is None:
        return f"{status.value} without a recorded error"
    if isinstance(error, BaseException):
        return format_error(error)
    return error


def _answer(
    ctx: CallContext,
    arguments: dict[str, Any],
    output: Any,
    status: EventStatus,
    error: str | None,
    error_info: ErrorInfo | None,
) -> tuple[ActionRequest, ActionResponse, ActionResponseModel]:
    """The linked message pair and the returned model of one call: the same facts, three views."""
    request, response = link_pair(
        function=ctx.function,
        arguments=arguments,
        output=output,
        error=error,
        branch_id=ctx.branch_id,
        call_id=ctx.call_id,
        tool_call_id=ctx.tool_call_id,
        request=ctx.request,
        requested_at=ctx.requested_at,
    )
    model = ActionResponseModel(
        function=ctx.function,
        arguments=arguments,
        output=output,
        status=status,
        error=error,
        call_id=ctx.call_id,
        tool_call_id=ctx.tool_call_id,
        tool_call_type=ctx.tool_call_type,
        error_info=error_info,
    )
    return request, response, model
