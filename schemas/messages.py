"""The linked ActionRequest/ActionResponse messages written to a branch's history."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field

from toolfleet.schemas.model import ToolfleetModel

__all__ = [
    "ActionRequest",
    "ActionRequestContent",
    "ActionResponse",
    "ActionResponseContent",
    "Message",
]


class ActionRequestContent(ToolfleetModel):
    function: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)
    action_response_id: str | None = None
    # The model's id of the call (or toolfleet's call_id when the model gave none) and
    # toolfleet's own id of it (the Celery task id): every message names its call.
    tool_call_id: str | None = None
    call_id: str | None = None


class ActionResponseContent(ToolfleetModel):
    function: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)
    output: Any = None
    action_request_id: str | None = None
    error: str | None = None
    tool_call_id: str | None = None
    call_id: str | None = None

    @property
    def success(self) -> bool:
        return self.error is None


class _MessageBase(ToolfleetModel):
    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    sender: str | None = None
    recipient: str | None = None


class ActionRequest(_MessageBase):
    role: Literal["action_request"] = "action_request"
    content: ActionRequestContent = Field(default_factory=ActionRequestContent)

    @property
    def function(self) -> str:
        return self.content.function

    @property
    def arguments(self) -> dict[str, Any]:
        return self.content.arguments

    def is_responded(self) -> bool:
        return self.content.action_response_id is not None


class ActionResponse(_MessageBase):
    role: Literal["action_response"] = "action_response"
    content: ActionResponseContent = Field(default_factory=ActionResponseContent)

    @property
    def success(self) -> bool:
        return self.content.success


Message = ActionRequest | ActionResponse
