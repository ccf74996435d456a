"""What crosses the broker: one queued call and its result. JSON only."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, PrivateAttr, field_validator

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.execution import Execution
from toolfleet.schemas.model import ToolfleetModel
from toolfleet.schemas.status import EventStatus, check_status

__all__ = ["CallMessage", "CallResult"]


class CallMessage(ToolfleetModel):
    """One call, as enqueued for a worker."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    # The model's id of the call (shown in Flower's task args and kept in the record).
    tool_call_id: str | None = None
    branch_id: str | None = None
    function: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = None
    attempt: int = Field(default=0, ge=0)
    # Redis list the worker pushes the CallResult onto, so a collector never polls.
    reply_to: str | None = None
    # The act() batch (its journal under Keys.batch) this call belongs to; None outside one.
    batch_id: str | None = None
    # The session of the call's branch (Session.id), for limit_key="session"; None: none.
    # How long the worker lets the call wait for its tool's rate limit or concurrency cap
    # before it ends FAILED RateLimitedError (CallParams.limit_wait_s, sent for a tool with a
    # limit); None: toolfleet.schemas.limits.DEFAULT_LIMIT_WAIT_S. Both are left out of the
    # message when None, so the call of a tool without limits is the message it always was.
    session_id: str | None = Field(default=None, exclude_if=lambda value: value is None)
    limit_wait_s: float | None = Field(default=None, ge=0, exclude_if=lambda value: value is None)
    # The dispatcher listens for the tool's progress reports (toolfleet.schemas.progress), which
    # then go to reply_to. Left out of the message when False, so a call that asks for none
    # is the message it always was (and a worker without progress support still reads it).
    progress: bool = Field(default=False, exclude_if=lambda listening: not listening)
    # The dispatcher's trace context (toolfleet.schemas.tracing.carrier()): not part of the body, it
    # travels in the Celery message headers, so a worker's span joins the caller's trace.
    _trace: dict[str, str] | None = PrivateAttr(default=None)

    @field_validator("timeout_s")
    @classmethod
    def _positive_seconds(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise ConfigurationError(f"must be a positive number of seconds or None, got {value!r}")
        return value


class CallResult(ToolfleetModel):
    """The terminal record of one call: the serialized event plus where it ran."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    function: str
    # FunctionCalling.to_dict(): id, created_at, execution, function, redacted arguments.
    event: dict[str, Any]
    attempt: int = Field(default=0, ge=0)
    worker: str | None = None
    # The batch of the call (CallMessage.batch_id), so recovery finds its record's place.
    batch_id: str | None = None

    @field_validator("event")
    @classmethod
    def _has_execution(cls, event: dict[str, Any]) -> dict[str, Any]:
        # Fail when a record is read, not later with a KeyError in .status.
        execution = event.get("execution")
        if not isinstance(execution, dict):
            raise ConfigurationError(
                f"event must hold an 'execution' dict (FunctionCalling.to_dict()), "
                f"got {type(execution).__name__}"
            )
        check_status(execution)
        return event

    @property
    def execution(self) -> dict[str, Any]:
        execution: dict[str, Any] = self.event["execution"]
        return execution

    @property
    def status(self) -> EventStatus:
        return EventStatus(self.execution["status"])

    def to_execution(self) -> Execution:
        return Execution.from_dict(self.execution)
