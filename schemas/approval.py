"""A call parked for approval, as Redis keeps it and every side reads it.

A call that needs a person's (or a program's) yes waits in Redis, not on a worker: one hash per
call (``Keys.approval(call_id)``) and one sorted set of the waiting call ids
(``Keys.approvals()``). The dispatcher that parked it polls the hash; anyone who can reach the
broker decides it (``toolfleet approve``/``deny``, ``Fleet.approve``/``deny``, an approval
handler) through one script (``approval_decide.lua``, run by
toolfleet.dispatcher.govern.approvals), which lets exactly one decision in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict

from toolfleet.schemas.model import ToolfleetModel

__all__ = [
    "DEFAULT_APPROVAL_TIMEOUT_S",
    "ApprovalRequest",
    "ApprovalState",
    "parked_message",
]

# An hour: long enough for a person to answer, short enough that a forgotten call ends.
DEFAULT_APPROVAL_TIMEOUT_S = 3600.0

ApprovalState = Literal["waiting", "approved", "denied", "expired"]


# The hash fields that are not ApprovalRequest fields: what the parked call's dispatcher, or
# `toolfleet recover`, needs to enqueue it once approved (its arguments unredacted, as a
# queued message carries them).
_PRIVATE_FIELDS = ("message", "route")


class ApprovalRequest(ToolfleetModel):
    """One call parked for approval: what ``toolfleet approvals`` lists and handlers get.

    ``arguments`` are redacted (a secret argument's value is never shown). ``requested_at``,
    ``expires_at`` and ``decided_at`` are epoch seconds.
    """

    model_config = ConfigDict(frozen=True)

    call_id: str
    tool: str
    arguments: dict[str, Any]
    branch_id: str | None = None
    batch_id: str | None = None
    tool_call_id: str | None = None
    reason: str = ""
    requested_at: float
    expires_at: float
    state: ApprovalState = "waiting"
    decided_by: str | None = None
    decided_at: float | None = None
    decision_reason: str | None = None

    @property
    def waiting(self) -> bool:
        return self.state == "waiting"

    @property
    def approved(self) -> bool:
        return self.state == "approved"

    def age_s(self, now_s: float | None = None) -> float:
        return max(0.0, (time.time() if now_s is None else now_s) - self.requested_at)

    def decision(self) -> dict[str, Any]:
        """The decision as the call's history records it (by whom, when, why)."""
        return {
            "decision": self.state,
            "by": self.decided_by,
            "at": self.decided_at,
            "reason": self.decision_reason,
            "requested_at": self.requested_at,
            "asked_because": self.reason,
        }

    def refusal_text(self) -> str:
        """What the model reads for a call that was not approved: who said no, and why."""
        if self.state == "expired":
            return (
                f"call of tool {self.tool!r} was not run: no one approved it within its "
                f"approval time ({self.decision_reason or 'timed out'}); ask again later or "
                "do without it"
            )
        why = f": {self.decision_reason}" if self.decision_reason else ""
        return f"call of tool {self.tool!r} was not run: denied by {self.decided_by}{why}"

    def to_fields(self, *, message: str, route: Mapping[str, Any]) -> dict[str, str]:
        """The hash fields that park this request, with the message that enqueues it."""
        fields = {
            key: json.dumps(value) if key == "arguments" else str(value)
            for key, value in self.model_dump().items()
            if value is not None
        }
        fields["message"] = message
        fields["route"] = json.dumps(dict(route))
        return fields

    @classmethod
    def from_fields(cls, raw: Mapping[bytes | str, bytes | str]) -> ApprovalRequest:
        """Read a parked call's hash (as redis-py returns it)."""
        data: dict[str, Any] = {}
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else key
            if name in _PRIVATE_FIELDS:
                continue
            data[name] = value.decode() if isinstance(value, bytes) else value
        data["arguments"] = json.loads(data.get("arguments", "{}"))
        return cls.model_validate(data)


def parked_message(raw: Mapping[bytes | str, bytes | str]) -> tuple[str, dict[str, Any]]:
    """The message JSON and route (queue and send options) stored with a parked call."""

    def text(name: str) -> str:
        value = raw.get(name.encode(), raw.get(name, ""))
        return value.decode() if isinstance(value, bytes) else str(value)

    return text("message"), json.loads(text("route") or "{}")
