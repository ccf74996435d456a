"""The approval methods of a ``Fleet``: decide parked calls, list them, install handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolfleet.dispatcher.govern.approvals import (
    ApprovalHandler,
    decide,
    default_decider,
    waiting_approvals,
)
from toolfleet.dispatcher.govern.extension import FLEET_HOOKS, AnyExtension, overridden
from toolfleet.schemas.approval import ApprovalRequest
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.keys import Keys

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["ApprovalDesk"]


class ApprovalDesk:
    """Mixed into ``Fleet``: everything a program does with calls waiting for approval.

    Any process that reaches the broker can decide any waiting call, whoever parked it: a
    decision is a Redis write, read by the dispatcher that waits (docs/controls.md).
    """

    keys: Keys
    approval_handlers: list[ApprovalHandler]

    @property
    def redis(self) -> aioredis.Redis:
        raise NotImplementedError

    async def approve(
        self, call_id: str, *, by: str | None = None, reason: str | None = None
    ) -> ApprovalRequest:
        """Let the waiting call ``call_id`` run; ApprovalNotWaitingError (an ApprovalError)
        when it is not waiting."""
        return await decide(
            self.redis, self.keys, call_id, "approved", by=by or default_decider(), reason=reason
        )

    async def deny(self, call_id: str, reason: str, *, by: str | None = None) -> ApprovalRequest:
        """Refuse the waiting call ``call_id``: it ends as a denial the model reads, with
        ``reason``; ApprovalNotWaitingError (an ApprovalError) when it is not waiting."""
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigurationError(
                f"deny() needs a reason, got {reason!r}; the model reads it, so say why "
                "(for example fleet.deny(call_id, 'only read-only queries today'))"
            )
        return await decide(
            self.redis, self.keys, call_id, "denied", by=by or default_decider(), reason=reason
        )

    async def approvals(self) -> list[ApprovalRequest]:
        """Every call of the fleet waiting for approval, oldest first."""
        return await waiting_approvals(self.redis, self.keys)

    def use(self, extension: AnyExtension) -> AnyExtension:
        """Register ``extension.on_approval`` as an approval handler (as :meth:`on_approval`;
        handlers are asked in registration order). Returns it."""
        overridden(extension, FLEET_HOOKS, "fleet")
        self.on_approval(extension.on_approval)
        return extension

    def on_approval(self, handler: ApprovalHandler) -> ApprovalHandler:
        """Install ``handler(request) -> True | False | None`` (sync or async): called in this
        process for each call its batches park. True approves, False denies, None leaves the
        call waiting for another decider; a handler that raises is logged, recorded as a
        CallbackFailed signal of the branch whose call it is, and skipped; one that returns
        anything else is logged and skipped. To deny with a reason the model reads, a handler awaits
        ``fleet.deny(request.call_id, reason)`` and returns None."""
        self.approval_handlers.append(handler)
        return handler
