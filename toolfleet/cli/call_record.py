"""One line's result in a ``toolfleet run``: what the call returned, and how it ended.

``outcome`` sorts every result into what the progress bar and summary count: ``done``
(completed), ``failed`` (the tool raised, timed out, was aborted), ``denied`` (a governance gate
refused it, or its approver did, or no one approved it in time), ``cancelled``, and
``malformed`` (the line never became a call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.error_info import ErrorInfo
from toolfleet.schemas.errors import MalformedRequestError
from toolfleet.schemas.status import EventStatus

__all__ = ["DENIED_ERROR", "OUTCOMES", "CallRecord", "Outcome"]

Outcome = Literal["done", "failed", "denied", "cancelled", "malformed"]
OUTCOMES: tuple[Outcome, ...] = ("done", "failed", "denied", "cancelled", "malformed")
# ADR-0012 D2: the output every denied call carries, whatever suppress_errors says.
DENIED_ERROR = "denied by governance gate"


@dataclass(slots=True)
class CallRecord:
    line_no: int
    function: str | None
    arguments: dict[str, Any]
    status: str
    outcome: Outcome
    output: Any = None
    error: str | None = None
    call_id: str | None = None
    tool_call_id: str | None = None
    duration_s: float | None = None
    # The error as structure (ActionResponseModel.error_info): what a script reads.
    error_info: ErrorInfo | None = None

    @classmethod
    def malformed(
        cls, line_no: int, function: str | None, arguments: dict[str, Any], error: str
    ) -> CallRecord:
        return cls(
            line_no=line_no,
            function=function,
            arguments=arguments,
            status=EventStatus.ABORTED.value,
            outcome="malformed",
            error=f"MalformedRequestError: {error}",
            error_info=ErrorInfo.of(MalformedRequestError(error)),
        )

    @classmethod
    def from_response(
        cls, line_no: int, response: ActionResponseModel, duration_s: float | None = None
    ) -> CallRecord:
        return cls(
            line_no=line_no,
            function=response.function,
            arguments=response.arguments,
            status=str(response.status.value),
            outcome=classify(response),
            output=response.output,
            error=response.error,
            call_id=response.call_id,
            tool_call_id=response.tool_call_id,
            duration_s=duration_s,
            error_info=response.error_info,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line_no,
            "call_id": self.call_id,
            "tool_call_id": self.tool_call_id,
            "function": self.function,
            "arguments": self.arguments,
            "status": self.status,
            "outcome": self.outcome,
            "output": self.output,
            "error": self.error,
            "error_info": None if self.error_info is None else self.error_info.model_dump(),
            "duration_s": self.duration_s,
        }


def classify(response: ActionResponseModel) -> Outcome:
    output = response.output
    if isinstance(output, dict) and output.get("error") == DENIED_ERROR:
        return "denied"
    if response.status is EventStatus.SKIPPED:  # refused by its approver: never ran
        return "denied"
    if response.status is EventStatus.CANCELLED:
        return "cancelled"
    if response.status is EventStatus.COMPLETED and response.error is None:
        return "done"
    return "failed"
