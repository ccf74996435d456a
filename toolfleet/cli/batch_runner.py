"""Run a parsed batch through ``Branch.act`` and turn each line into a :class:`CallRecord`.

The whole batch is one ``act()``, so every call keeps the ADR-0012 transaction (its own
authorization, call_id, event and message pair) and the branch history is in input order.

Progress counts each call once, at the first of: its result arriving from a worker (seen
through :meth:`Fleet.expect`, in completion order) or its event being written (the session's
observer, in input order; this also covers calls aborted before enqueue). Denied calls have
neither and are counted when the batch ends; the returned records are the truth.

``on_call_progress`` gets the progress reports of running calls (``Branch.on_progress``), and
``on_call_end`` each call's id once its result is in, so a screen can drop its line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from toolfleet.cli.batch_file import BatchLine
from toolfleet.cli.call_record import CallRecord, Outcome
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.session import Gate, Session
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.error_info import ErrorInfo
from toolfleet.schemas.errors import InternalError
from toolfleet.schemas.messages import ActionResponse, Message
from toolfleet.schemas.progress import CallProgress
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallResult

__all__ = ["BatchResult", "run_batch"]

ProgressCallback = Callable[[Outcome], None]
RecordCallback = Callable[[CallRecord], None]


@dataclass(frozen=True, slots=True)
class BatchResult:
    branch_id: str
    records: list[CallRecord]
    elapsed_s: float


_STATUS_OUTCOME: dict[str, Outcome] = {
    EventStatus.COMPLETED.value: "done",
    EventStatus.CANCELLED.value: "cancelled",
}


class _WatchedFleet(Fleet):
    """A Fleet that reports each call's result the moment the collector receives it."""

    def __init__(self, settings: Settings, on_result: Callable[[str, str], None]) -> None:
        super().__init__(settings)
        self._on_result = on_result

    def expect(self, call_id: str, attempt: int) -> asyncio.Future[CallResult]:
        future = super().expect(call_id, attempt)

        def done(fut: asyncio.Future[CallResult]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                self._on_result(call_id, str(fut.result().status.value))

        future.add_done_callback(done)
        return future


def _streamer(
    calls: Sequence[BatchLine],
    statuses: dict[str, str],
    durations: dict[str, float],
    errors: dict[str, ErrorInfo],
    on_record: RecordCallback,
) -> Callable[[Message], None]:
    """An on_message callback: each ActionResponse, written in input order, is the next
    call's result; its status is its last event's (a denied call has none: SKIPPED)."""
    position = iter(calls)

    def on_message(message: Message) -> None:
        if not isinstance(message, ActionResponse):
            return
        line = next(position, None)
        if line is None:
            return
        content = message.content
        call_id = content.call_id or ""
        status = statuses.get(call_id, EventStatus.SKIPPED.value)
        response = ActionResponseModel(
            function=content.function,
            arguments=content.arguments,
            output=content.output,
            status=EventStatus(status),
            error=content.error,
            call_id=content.call_id,
            tool_call_id=content.tool_call_id,
            error_info=errors.get(call_id) if content.error is not None else None,
        )
        on_record(CallRecord.from_response(line.line_no, response, durations.get(call_id)))

    return on_message


async def run_batch(
    lines: Sequence[BatchLine],
    *,
    settings: Settings,
    strategy: str = "concurrent",
    max_in_flight: int | None = None,
    gates: Sequence[Gate] = (),
    on_progress: ProgressCallback | None = None,
    branch_id: str | None = None,
    on_record: RecordCallback | None = None,
    on_call_progress: Callable[[CallProgress], None] | None = None,
    on_call_end: Callable[[str], None] | None = None,
) -> BatchResult:
    """Run every well-formed line as one ``act()``; malformed lines become error records.

    ``on_record`` gets each call's record as soon as its history is written (input order),
    also for the calls an interrupted batch records as cancelled on its way out."""
    started = time.monotonic()
    counted: set[str] = set()

    def count(call_id: str | None, status: str) -> None:
        if on_call_end is not None and call_id is not None:
            on_call_end(call_id)
        if on_progress is None or call_id is None or call_id in counted:
            return
        counted.add(call_id)
        on_progress(_STATUS_OUTCOME.get(status, "failed"))

    fleet = _WatchedFleet(settings, count)
    try:
        session = Session(fleet)
        for gate in gates:
            session.gate(gate)
        durations: dict[str, float] = {}
        statuses: dict[str, str] = {}
        errors: dict[str, ErrorInfo] = {}

        def observe(record: EventRecord) -> None:
            call_id = record.call_id or record.id
            if call_id is not None and record.duration_s is not None:
                durations[call_id] = record.duration_s
            if call_id is not None:
                statuses[call_id] = record.status.value
                info = ErrorInfo.from_record(record.execution.get("error"))
                if info is not None:
                    errors[call_id] = info
            count(call_id, record.status.value)

        session.subscribe(observe)
        branch = session.new_branch(id=branch_id)
        calls = [line for line in lines if line.error is None]
        if on_record is not None:
            branch.on_message(_streamer(calls, statuses, durations, errors, on_record))
        if on_call_progress is not None:
            branch.on_progress(on_call_progress)
        for line in lines:
            if line.error is not None and on_progress is not None:
                on_progress("malformed")
        responses = await branch.act(
            [line.request for line in calls],
            strategy=strategy,
            suppress_errors=True,
            # One result per line, also for a call whose output is None.
            call_params=CallParams(max_in_flight=max_in_flight, output_dropna=False),
        )
        if len(responses) != len(calls):
            raise InternalError(
                f"Branch.act returned {len(responses)} results for {len(calls)} calls"
            )
        by_line = {
            line.line_no: CallRecord.from_response(
                line.line_no, response, durations.get(response.call_id or "")
            )
            for line, response in zip(calls, responses, strict=True)
        }
        records = [
            by_line[line.line_no]
            if line.error is None
            else CallRecord.malformed(line.line_no, line.function, line.arguments, line.error)
            for line in lines
        ]
        return BatchResult(str(branch.id), records, time.monotonic() - started)
    finally:
        await fleet.aclose()
