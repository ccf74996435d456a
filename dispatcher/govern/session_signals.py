"""Recorded signals: things a session's owner should know that are not call results."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

__all__ = ["CallbackFailed", "GateDenied", "HistoryWriteFailed", "Signal"]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class GateDenied:
    """The session gate refused a call (falsy result or an exception)."""

    call_id: str
    function: str
    branch_id: str | None
    reason: str
    at: datetime = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class CallbackFailed:
    """A user callback raised (a hook handler, event observer, message or progress callback,
    approval handler or extension method); it was isolated (C5)."""

    call_id: str | None
    # "tool_post", "tool_error", "observer", "on_message", "on_progress", "approval",
    # or an extension's method name
    where: str
    handler: str
    error: str
    at: datetime = field(default_factory=_now)


@dataclass(frozen=True, slots=True)
class HistoryWriteFailed:
    """Redis refused a history write; the in-memory history still holds the unit, and the
    write is retried in order until the outage limit."""

    call_id: str | None
    branch_id: str | None
    error: str
    at: datetime = field(default_factory=_now)
    # Units of the branch not yet in Redis when the signal was raised.
    unwritten: int = 0


Signal = GateDenied | CallbackFailed | HistoryWriteFailed
