"""What crosses the broker: one queued call and its result. JSON only."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schemas.execution import Execution
from schemas.status import EventStatus

__all__ = ["CallMessage", "CallResult"]


class CallMessage(BaseModel):
    """One call, as enqueued for a worker."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    branch_id: str | None = None
    function: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = None
    attempt: int = 0
    # Redis list the worker pushes the CallResult onto, so a collector never polls.
    reply_to: str | None = None


class CallResult(BaseModel):
    """The terminal record of one call: the serialized event plus where it ran."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    function: str
    # FunctionCalling.to_dict(): id, created_at, execution, function, redacted arguments.
    event: dict[str, Any]
    attempt: int = 0
    worker: str | None = None

    @property
    def execution(self) -> dict[str, Any]:
        execution: dict[str, Any] = self.event["execution"]
        return execution

    @property
    def status(self) -> EventStatus:
        return EventStatus(self.execution["status"])

    def to_execution(self) -> Execution:
        return Execution.from_dict(self.execution)
