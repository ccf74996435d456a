"""Run a parsed batch through ``Branch.act`` and turn each line into a :class:`CallRecord`.

The whole batch is one ``act()``, so every call keeps the ADR-0012 transaction (its own
authorization, call_id, event and message pair) and the branch history is in input order.
Progress comes from the session's event observer, which fires as each call's event is
written; the returned records are the truth the summary counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.batch_file import BatchLine
from dispatcher.call_record import CallRecord, Outcome
from dispatcher.fleet import Fleet
from dispatcher.session import Gate, Session
from schemas.action import CallParams
from schemas.status import EventStatus
from workers.settings import Settings

__all__ = ["BatchResult", "run_batch"]

ProgressCallback = Callable[[Outcome], None]


@dataclass(frozen=True, slots=True)
class BatchResult:
    branch_id: str
    records: list[CallRecord]
    elapsed_s: float


_STATUS_OUTCOME: dict[str, Outcome] = {
    EventStatus.COMPLETED.value: "done",
    EventStatus.CANCELLED.value: "cancelled",
}


def _event_call_id(record: dict[str, Any]) -> str | None:
    call_id = record.get("call_id") or record.get("id")
    return str(call_id) if call_id is not None else None


def _event_duration(record: dict[str, Any]) -> float | None:
    execution = record.get("execution")
    if isinstance(execution, dict):
        duration = execution.get("duration")
        if isinstance(duration, int | float):
            return float(duration)
    return None


async def run_batch(
    lines: Sequence[BatchLine],
    *,
    settings: Settings,
    strategy: str = "concurrent",
    max_concurrent: int | None = None,
    gates: Sequence[Gate] = (),
    on_progress: ProgressCallback | None = None,
    branch_id: str | None = None,
) -> BatchResult:
    """Run every well-formed line as one ``act()``; malformed lines become error records."""
    started = time.monotonic()
    fleet = Fleet(settings)
    try:
        session = Session(fleet)
        for gate in gates:
            session.gate(gate)
        durations: dict[str, float] = {}

        def observe(event_record: dict[str, Any]) -> None:
            call_id = _event_call_id(event_record)
            duration = _event_duration(event_record)
            if call_id is not None and duration is not None:
                durations[call_id] = duration
            if on_progress is not None:
                execution = event_record.get("execution") or {}
                status = str(execution.get("status", ""))
                on_progress(_STATUS_OUTCOME.get(status, "failed"))

        session.subscribe(observe)
        branch = session.new_branch(id=branch_id)
        calls = [line for line in lines if line.error is None]
        for line in lines:
            if line.error is not None and on_progress is not None:
                on_progress("malformed")
        responses = await branch.act(
            [line.request for line in calls],
            strategy=strategy,
            suppress_errors=True,
            # One result per line, also for a call whose output is None.
            call_params=CallParams(max_concurrent=max_concurrent, output_dropna=False),
        )
        if len(responses) != len(calls):
            raise RuntimeError(
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
