"""The lifecycle states of an execution event (ADR-0012 D1)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TERMINAL_STATUSES", "EventStatus"]


class EventStatus(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    ABORTED = "aborted"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {
        EventStatus.COMPLETED,
        EventStatus.FAILED,
        EventStatus.SKIPPED,
        EventStatus.CANCELLED,
        EventStatus.ABORTED,
    }
)
