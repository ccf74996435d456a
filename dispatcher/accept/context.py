"""The one normalized view of a call that every policy phase sees (C4)."""

from __future__ import annotations

import dataclasses
import os
import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from toolfleet.schemas.action import ToolInvocation
from toolfleet.schemas.function_calling import redact
from toolfleet.schemas.messages import ActionRequest
from toolfleet.schemas.record import shown_arguments
from toolfleet.schemas.tool import Tool

__all__ = ["CallContext", "call_id_for", "new_call_id"]

# Namespace of the call ids derived from a model's tool-call ids (uuid5, so stable).
_TOOL_CALL_NAMESPACE = uuid.UUID("6f0c1d52-3a0e-4f5b-9a43-2c7d1e8b9f10")


# A generator of our own, seeded from the OS and re-seeded in a forked child: the module-level
# one is shared with the caller, and a caller (or hypothesis, or a simulation) that seeds it
# would repeat call ids, and the workers' idempotency records would answer a new call with an
# old call's result (found by the bad-input JSONL fuzz).
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def new_call_id() -> str:
    """A random (version 4) UUID string.

    From a private ``random.Random`` (seeded from the OS, re-seeded after fork) rather than
    ``uuid.uuid4()``: one ``os.urandom`` syscall per id costs more than the rest of a
    call's dispatch on some hosts, and these ids need uniqueness, not secrecy.
    """
    return str(uuid.UUID(int=_ids.getrandbits(128), version=4))


def call_id_for(branch_id: str | None, tool_call_id: str | None) -> str:
    """The call's id: derived from the model's ``tool_call_id`` within its branch, else new.

    Derived, so replaying the same model response in the same branch reuses the call ids,
    and the workers' idempotency records (C7) answer finished calls without re-running them.
    """
    if tool_call_id is None:
        return new_call_id()
    return str(uuid.uuid5(_TOOL_CALL_NAMESPACE, f"{branch_id or ''}\x00{tool_call_id}"))


@dataclass(slots=True)
class CallContext:
    """call_id, branch, function and normalized arguments of one call.

    The gate, TOOL_PRE and the permission policy all read ``arguments`` from this one
    object, so they judge exactly what the tool will receive.
    """

    function: str
    arguments: dict[str, Any]
    branch_id: str | None = None
    call_id: str = field(default_factory=new_call_id)
    tool: Tool | None = None
    # The model's id of the call; toolfleet's call_id when the model gave none.
    tool_call_id: str = ""
    # The caller's own ActionRequest, which history keeps as this call's request.
    request: ActionRequest | None = None
    # "custom": an OpenAI custom tool call, whose result renders as its own item type.
    tool_call_type: Literal["function", "custom"] = "function"
    # The approval decision of a call that was parked for one (ApprovalRequest.decision()).
    approval: dict[str, Any] | None = None
    # When act() took the call: its ActionRequest's time in history, written only once the
    # call ends, so that requests in input order read in time order too.
    requested_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def __post_init__(self) -> None:
        if not self.tool_call_id:
            self.tool_call_id = self.call_id

    @property
    def secret_args(self) -> frozenset[str]:
        return self.tool.secret_args if self.tool is not None else frozenset()

    @property
    def public_arguments(self) -> dict[str, Any]:
        """The arguments with secret values replaced, safe for history, events and hooks."""
        return shown_arguments(self.arguments, self.secret_args)

    def for_hooks(self) -> CallContext:
        """This context as hook handlers get it: every secret argument value redacted, in the
        arguments and in the caller's request. Without secrets, the
        context itself, so a handler sees exactly what the tool will receive (C4)."""
        secret = self.secret_args
        if not secret:
            return self
        request = self.request
        if request is not None:
            content = request.content
            hidden = redact(content.arguments, secret)
            request = request.model_copy(
                update={"content": content.model_copy(update={"arguments": hidden})}
            )
        return dataclasses.replace(self, arguments=redact(self.arguments, secret), request=request)

    def invocation(self) -> ToolInvocation:
        return ToolInvocation(
            function=self.function, arguments=dict(self.arguments), branch_id=self.branch_id
        )
