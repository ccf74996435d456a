"""The execution state carried by every event (ADR-0012 D1)."""

from __future__ import annotations

from typing import Any

from toolfleet.schemas.error_info import error_record
from toolfleet.schemas.serialize import to_jsonable
from toolfleet.schemas.status import EventStatus

__all__ = ["MAX_ERRORS", "Execution"]

# Inherited from the generic event layer: bounds the size of a serialized error group.
MAX_ERRORS = 100


class Execution:
    """Status, duration (seconds), response, error and retryable flag of one execution."""

    __slots__ = ("duration", "error", "response", "retryable", "status")

    def __init__(
        self,
        duration: float | None = None,
        response: Any = None,
        status: EventStatus = EventStatus.PENDING,
        error: str | BaseException | None = None,
        retryable: bool | None = None,
    ) -> None:
        self.duration = duration
        self.response = response
        self.status = EventStatus(status)
        self.error = error
        self.retryable = retryable

    def add_error(self, exc: BaseException) -> None:
        """Record ``exc``; several errors fold into one group of at most 100 members."""
        if self.error is None:
            self.error = exc
            return
        if isinstance(self.error, BaseExceptionGroup):
            members = [*self.error.exceptions, exc]
        elif isinstance(self.error, BaseException):
            members = [self.error, exc]
        else:
            members = [RuntimeError(self.error), exc]
        # Keep the newest: the last failures explain the final state.
        self.error = BaseExceptionGroup("multiple errors", members[-MAX_ERRORS:])

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": EventStatus(self.status).value,
            "duration": self.duration,
            "response": to_jsonable(self.response),
            "error": _error_to_jsonable(self.error),
            "retryable": self.retryable,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Execution:
        """Rebuild from :meth:`to_dict` output; errors stay in their serialized form."""
        error = data.get("error")
        return cls(
            duration=data.get("duration"),
            response=data.get("response"),
            status=EventStatus(data.get("status", EventStatus.PENDING.value)),
            error=None if error is None else _error_text(error),
            retryable=data.get("retryable"),
        )

    def __repr__(self) -> str:
        return (
            f"Execution(status={EventStatus(self.status).value!r}, duration={self.duration!r}, "
            f"response={self.response!r}, error={self.error!r})"
        )


def _error_to_jsonable(error: str | BaseException | None) -> Any:
    if error is None or isinstance(error, str):
        return error
    described: dict[str, Any] = error_record(error)
    if isinstance(error, BaseExceptionGroup):
        # A group raised by a tool itself is not capped by add_error; cap what is stored.
        # Its message still says how many members it had.
        described["exceptions"] = [_error_to_jsonable(e) for e in error.exceptions[-MAX_ERRORS:]]
    return described


def _error_text(error: Any) -> str:
    if isinstance(error, dict) and "error" in error:
        return f"{error['error']}: {error.get('message', '')}"
    return str(error)
