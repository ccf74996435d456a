"""The one normalized view of a call that every policy phase sees (C4)."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from typing import Any

from schemas.action import ToolInvocation
from schemas.function_calling import redact
from schemas.serialize import jsonable_key, to_jsonable
from schemas.tool import Tool

__all__ = ["CallContext", "new_call_id"]


def new_call_id() -> str:
    """A random (version 4) UUID string.

    From the ``random`` module (seeded from the OS, re-seeded after fork) rather than
    ``uuid.uuid4()``: one ``os.urandom`` syscall per id costs more than the rest of a
    call's dispatch on some hosts, and these ids need uniqueness, not secrecy.
    """
    return str(uuid.UUID(int=random.getrandbits(128), version=4))


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

    @property
    def secret_args(self) -> frozenset[str]:
        return self.tool.secret_args if self.tool is not None else frozenset()

    @property
    def public_arguments(self) -> dict[str, Any]:
        """The arguments with secret values replaced, safe for history, events and hooks."""
        redacted = redact(self.arguments, self.secret_args)
        return {jsonable_key(key): to_jsonable(value) for key, value in redacted.items()}

    def invocation(self) -> ToolInvocation:
        return ToolInvocation(
            function=self.function, arguments=dict(self.arguments), branch_id=self.branch_id
        )
