"""Completing a dead dispatcher's batches from their journals.

For each open batch of a branch (``toolfleet.dispatcher.history.journal``), the calls past the
journal's written count are located (:mod:`toolfleet.dispatcher.watch.whereabouts`). Calls still
queued, reserved or running are waited for, up to ``wait_s`` (then they are stopped and recorded
FAILED, like a straggler); calls parked for approval are waited for until decided, and sent once
approved (:mod:`toolfleet.dispatcher.history.recover_approvals`). Every call then has its unit
written in input order: a finished call with its real record, a call found nowhere (the
dispatcher died before enqueueing it) as ABORTED, recorded first so that no worker can run it
later. The write advances the journal's written count in the same script
(``toolfleet.dispatcher.history.durable``), so recovering twice, or racing the dispatcher
itself, never writes a unit twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.history.history import BranchHistory, Unit, link_pair
from toolfleet.dispatcher.history.journal import (
    JournalCall,
    JournalEntry,
    close_journal,
    load_journal,
    open_batches,
    progress_key,
)
from toolfleet.dispatcher.history.recover_approvals import (
    ParkedCall,
    expire_parked,
    parked_calls,
    refresh_parked,
    refusal_result,
    send_approved,
)
from toolfleet.dispatcher.watch.cancel import settle_calls
from toolfleet.dispatcher.watch.whereabouts import NowhereTwice, Place, locate
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.error_info import ErrorInfo
from toolfleet.schemas.errors import (
    ApprovalDeniedError,
    BrokerError,
    DispatcherLostError,
    ToolTimeoutError,
)
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.serialize import format_error
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage, CallResult

__all__ = ["RecoverReport", "recover_branch"]

log = logging.getLogger(__name__)

_POLL_S = 1.0


@dataclass(slots=True)
class RecoverReport:
    """What one recovery did: batches completed, units written, calls by outcome."""

    batches: list[str] = field(default_factory=list)
    skipped_live: list[str] = field(default_factory=list)
    written: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


Progress = Callable[[int, int], None]  # (settled calls, calls to settle)


async def recover_branch(
    branch_id: str,
    fleet: Fleet,
    *,
    wait_s: float = 300.0,
    include_live: bool = False,
    on_progress: Progress | None = None,
) -> RecoverReport:
    """Write every missing unit of ``branch_id``'s open batches whose dispatcher is gone."""
    report = RecoverReport()
    for batch_id, owner, alive in await open_batches(fleet.redis, fleet.keys):
        if owner != branch_id:
            continue
        if alive and not include_live:
            report.skipped_live.append(batch_id)
            continue
        loaded = await load_journal(fleet.redis, fleet.keys, batch_id)
        if loaded is None:
            continue
        entry, written = loaded
        units = await _settle(fleet, entry, entry.calls[written:], wait_s, on_progress)
        history = BranchHistory(branch_id)
        progress = (progress_key(fleet.keys, batch_id), written, len(entry.calls))
        error = await history.write(
            fleet.redis,
            fleet.keys,
            units,
            record_ttl_s=fleet.settings.record_ttl_s,
            progress=progress,
        )
        if error is None:
            error = await history.durable.drain(
                fleet.redis, fleet.keys, fleet.settings.record_ttl_s, fleet.settings.outage_limit_s
            )
        if error is not None:
            raise BrokerError(f"batch {batch_id}: recovered units not written: {error}")
        await close_journal(fleet.redis, fleet.keys, batch_id)
        report.batches.append(batch_id)
        report.written += len(units)
        for unit in units:
            status = unit.result.status.value
            report.outcomes[status] = report.outcomes.get(status, 0) + 1
    return report


async def _settle(
    fleet: Fleet,
    entry: JournalEntry,
    calls: list[JournalCall],
    wait_s: float,
    on_progress: Progress | None,
) -> list[Unit]:
    """Wait for the calls still in flight; return every call's unit, in input order."""
    records: dict[str, CallResult] = {}
    nowhere: dict[str, NowhereTwice] = {}
    never_enqueued: set[str] = set()
    grace_s = fleet.settings.reconcile_grace_s
    deadline = time.monotonic() + wait_s
    queues = [fleet.settings.queue_for("sync"), fleet.settings.queue_for("async")]
    # Calls parked for approval stay decidable: waited for, sent once approved
    # (toolfleet.dispatcher.history.recover_approvals).
    parked = await parked_calls(fleet, [c.call_id for c in calls])
    while True:
        pending = [c for c in calls if c.call_id not in records and c.call_id not in never_enqueued]
        if on_progress is not None:
            on_progress(len(calls) - len(pending), len(calls))
        if not pending:
            break
        now = time.monotonic()
        await refresh_parked(fleet, parked, [c.call_id for c in pending])
        sightings = await locate(fleet.redis, fleet.keys, [c.call_id for c in pending], queues)
        for call in pending:
            sighting = sightings[call.call_id]
            held = parked.get(call.call_id)
            if sighting.place == Place.FINISHED and sighting.record is not None:
                records[call.call_id] = CallResult.model_validate_json(sighting.record)
            elif held is not None and held.request.waiting:
                if time.time() >= held.request.expires_at:  # its approval time is over
                    why = "no decision within its approval time"
                    decided = await expire_parked(fleet, held, why)
                    held.request = decided  # the final word, which its unit records
                    records[call.call_id] = refusal_result(_message(entry, call), decided)
                # else not lost: waiting for its decision
            elif held is not None and not held.request.approved:
                records[call.call_id] = refusal_result(_message(entry, call), held.request)
            elif nowhere.setdefault(call.call_id, NowhereTwice()).saw(sighting.place, now, grace_s):
                if held is not None and not held.sent:
                    # Approved, and its dispatcher died before sending it: sent now.
                    await send_approved(fleet, held)
                    nowhere[call.call_id] = NowhereTwice()
                    continue
                # Nowhere twice a grace apart: not in transit, so never enqueued (or lost).
                never_enqueued.add(call.call_id)
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(_POLL_S)
    pending = [c for c in calls if c.call_id not in records and c.call_id not in never_enqueued]
    for call in [c for c in pending if c.call_id in parked and parked[c.call_id].request.waiting]:
        why = f"`toolfleet recover` stopped waiting for a decision after {wait_s:g}s"
        decided = await expire_parked(fleet, parked[call.call_id], why)
        parked[call.call_id].request = decided  # the final word, which its unit records
        records[call.call_id] = refusal_result(_message(entry, call), decided)
    pending = [c for c in pending if c.call_id not in records]
    records.update(await _stop(fleet, entry, pending, wait_s))
    records.update(await _abort(fleet, entry, [c for c in calls if c.call_id in never_enqueued]))
    return [_unit(entry, call, records[call.call_id], parked.get(call.call_id)) for call in calls]


def _message(entry: JournalEntry, call: JournalCall) -> CallMessage:
    return CallMessage(
        call_id=call.call_id,
        branch_id=entry.branch_id,
        function=call.function or "?",
        arguments=call.arguments,
        batch_id=entry.batch_id,
    )


def _tool(fleet: Fleet, function: str) -> Tool | None:
    return fleet.registry.get(function) if function in fleet.registry else None


async def _stop(
    fleet: Fleet, entry: JournalEntry, calls: list[JournalCall], wait_s: float
) -> dict[str, CallResult]:
    """Calls still queued or running when the wait ended: recorded FAILED and revoked."""
    stops = [(_message(entry, c), _tool(fleet, c.function)) for c in calls]

    def error(message: CallMessage) -> BaseException:
        # The error a live dispatcher records for a straggler, so a reader sees one outcome.
        return ToolTimeoutError(
            f"call {message.call_id} of tool {message.function!r} was still queued or running "
            f"when `toolfleet recover` stopped waiting after {wait_s:g}s; it was revoked",
            timeout_s=wait_s,
        )

    return await settle_calls(fleet, stops, error, EventStatus.FAILED)


async def _abort(
    fleet: Fleet, entry: JournalEntry, calls: list[JournalCall]
) -> dict[str, CallResult]:
    """Calls found nowhere: recorded ABORTED first, so no worker runs them later."""
    stops = [(_message(entry, c), _tool(fleet, c.function)) for c in calls]

    def error(message: CallMessage) -> BaseException:
        return DispatcherLostError(
            f"the dispatcher of batch {entry.batch_id} was lost before it enqueued call "
            f"{message.call_id} of tool {message.function!r}; it never ran. Re-run it if it "
            f"is still wanted"
        )

    return await settle_calls(fleet, stops, error, EventStatus.ABORTED)


def _unit(
    entry: JournalEntry, call: JournalCall, result: CallResult, held: ParkedCall | None
) -> Unit:
    execution = result.to_execution()
    status = execution.status
    output = execution.response
    error: str | None = None
    info: ErrorInfo | None = None
    if status is not EventStatus.COMPLETED:
        raw = execution.error
        error = format_error(raw) if isinstance(raw, BaseException) else str(raw or status.value)
        info = ErrorInfo.from_record(result.execution.get("error"))
    if status is EventStatus.ABORTED:
        output = {"error": error, "function": call.function, "arguments": call.arguments}
    elif status is EventStatus.SKIPPED:  # denied, or not decided in time, while parked
        if held is not None and not held.request.waiting:
            # The model reads the refusal itself (who said no, and why), without the error
            # class a record's error carries: what a live dispatcher gives it (unapproved_unit).
            error = held.request.refusal_text()
            info = ErrorInfo.of(ApprovalDeniedError(error))
        output = {"error": error, "function": call.function}
    tool_call_id = call.tool_call_id or None
    request, response = link_pair(
        function=call.function,
        arguments=call.arguments,
        output=output,
        error=error,
        branch_id=entry.branch_id,
        call_id=call.call_id,
        tool_call_id=tool_call_id,
    )
    model = ActionResponseModel(
        function=call.function,
        arguments=call.arguments,
        output=output,
        status=status,
        error=error,
        call_id=call.call_id,
        tool_call_id=tool_call_id,
        error_info=info,
    )
    event = EventRecord.from_dict(result.event).in_history(
        call_id=call.call_id,
        tool_call_id=tool_call_id,
        branch_id=entry.branch_id,
        attempt=result.attempt,
        worker=result.worker,
        batch_id=entry.batch_id,
    )
    if held is not None and event.approval is None:
        # A call approved while parked ran on a worker, whose record knows nothing of the
        # approval: its decision is added here, as a live dispatcher adds it to every record
        # of a parked call (a refusal's record already carries its own).
        event.approval = held.request.decision()
    return Unit(call.call_id, [event], request, response, model)
