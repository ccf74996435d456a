"""The lifecycle states of an execution event (ADR-0012 D1)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from toolfleet.schemas.errors import ConfigurationError

__all__ = ["TERMINAL_STATUSES", "EventStatus", "check_status"]


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


def check_status(execution: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``execution["status"]`` is an EventStatus value: a record with
    another fails where it is read, not later in its ``status``."""
    status: Any = execution.get("status")
    try:
        EventStatus(status)
    except (ValueError, TypeError):
        raise ConfigurationError(
            f"event execution status {status!r} is not one of {[s.value for s in EventStatus]}"
        ) from None
