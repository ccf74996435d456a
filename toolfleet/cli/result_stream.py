"""Results of a ``toolfleet run`` written as calls finish, so an interrupted run keeps them.

Each call's record arrives when its history is written (in input order, ADR-0012 C5); the
stream writes it at once to every sink (``--output``, ``--json``'s stdout), flushed, with the
malformed lines in their places. On Ctrl-C the calls never answered are written as cancelled
lines, so every line of the batch has exactly one result line, whatever stopped the run.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import TextIO

from toolfleet.cli.batch_file import BatchLine
from toolfleet.cli.call_record import CallRecord
from toolfleet.schemas.status import EventStatus

__all__ = ["ResultStream", "not_started"]


def not_started(line: BatchLine) -> CallRecord:
    """The record of a call the run was interrupted before it answered."""
    return CallRecord(
        line_no=line.line_no,
        function=line.function,
        arguments=line.arguments,
        status=EventStatus.CANCELLED.value,
        outcome="cancelled",
        error="CancelledError: the run was interrupted before this call finished",
        tool_call_id=line.tool_call_id,
    )


class ResultStream:
    """Writes each line's record to the sinks in input order, each as soon as it is known."""

    def __init__(self, lines: Sequence[BatchLine], sinks: Sequence[TextIO], branch_id: str):
        self.lines = list(lines)
        self.sinks = list(sinks)
        self.branch_id = branch_id
        self.records: dict[int, CallRecord] = {}
        self._next = 0  # index into lines of the first line not yet written

    @property
    def calls_recorded(self) -> int:
        """Calls (not malformed lines) whose result is known."""
        return sum(1 for record in self.records.values() if record.outcome != "malformed")

    def add(self, record: CallRecord) -> None:
        """Take one call's record and write every line that is now ready."""
        self.records[record.line_no] = record
        self._drain()

    def finish(self, records: Sequence[CallRecord]) -> None:
        """The batch ended: its records are the truth; write the lines not yet written."""
        for record in records:
            self.records.setdefault(record.line_no, record)
        self._drain()

    def interrupt(self) -> list[CallRecord]:
        """The run was interrupted: every line without a result is written as cancelled."""
        for line in self.lines:
            if line.line_no not in self.records and line.error is None:
                self.records[line.line_no] = not_started(line)
        self._drain()
        return [self.records[line.line_no] for line in self.lines]

    def _drain(self) -> None:
        while self._next < len(self.lines):
            line = self.lines[self._next]
            record = self.records.get(line.line_no)
            if record is None and line.error is not None:
                record = CallRecord.malformed(
                    line.line_no, line.function, line.arguments, line.error
                )
                self.records[line.line_no] = record
            if record is None:
                return
            self._write(record)
            self._next += 1

    def _write(self, record: CallRecord) -> None:
        text = json.dumps({"branch_id": self.branch_id, **record.to_json()}, default=str) + "\n"
        for sink in self.sinks:
            # A closed pipe (``| head``) must not stop the batch or lose the other sink.
            with contextlib.suppress(OSError, ValueError):
                sink.write(text)
                sink.flush()
