"""How long a batch waits for each call: the per-call ``timeout_s`` and the batch ``deadline_s``.

The worker enforces ``timeout_s`` on the tool's run (and records a ToolTimeoutError itself).
The dispatcher enforces both from its side, so a call that never reaches a worker (queued
behind others, worker lost, broker restarted) cannot hold the batch past either limit: when a
limit passes, the straggler gets a FAILED ToolTimeoutError result and is revoked (see
:mod:`toolfleet.dispatcher.watch.cancel`), and the finished results are returned.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from toolfleet.schemas.action import CallParams
from toolfleet.schemas.errors import ToolTimeoutError
from toolfleet.schemas.wire import CallMessage, CallResult

__all__ = ["Deadline", "report_grace_s"]


def report_grace_s(timeout_s: float) -> float:
    """Extra wait past a call's timeout_s, so the worker's own timeout record arrives first."""
    return max(0.5, 0.1 * timeout_s)


@dataclass(slots=True)
class Deadline:
    """The batch's absolute deadline (event-loop time) and its per-call timeout."""

    deadline_s: float | None
    timeout_s: float | None
    _at: float | None = None

    @classmethod
    def start(cls, params: CallParams) -> Deadline:
        """Start the batch clock now (call inside the running loop)."""
        at = None
        if params.deadline_s is not None:
            at = asyncio.get_running_loop().time() + params.deadline_s
        return cls(params.deadline_s, params.timeout_s, at)

    def remaining_s(self) -> float | None:
        """Seconds left in the batch, or None without a batch deadline."""
        if self._at is None:
            return None
        return self._at - asyncio.get_running_loop().time()

    def expired(self) -> bool:
        left = self.remaining_s()
        return left is not None and left <= 0

    async def wait(self, future: asyncio.Future[CallResult], message: CallMessage) -> CallResult:
        """The call's result; ToolTimeoutError (naming the limit) if a limit passes first.

        The future itself is left alone on timeout (the caller decides what happens to it).
        """
        call_s = None if self.timeout_s is None else self.timeout_s + report_grace_s(self.timeout_s)
        batch_s = self.remaining_s()
        bound = _smallest(call_s, batch_s)
        if bound is None:
            return await future
        try:
            return await asyncio.wait_for(asyncio.shield(future), max(bound, 0.0))
        except TimeoutError:
            raise self.error(message, by_batch=batch_s is not None and batch_s == bound) from None

    def error(self, message: CallMessage, *, by_batch: bool) -> ToolTimeoutError:
        """The straggler's error: which limit it missed and what to do."""
        if by_batch and self.deadline_s is not None:
            return ToolTimeoutError(
                f"call {message.call_id} of tool {message.function!r} did not finish within "
                f"the batch deadline_s={self.deadline_s:g}; it was revoked. Raise "
                f"call_params.deadline_s or add workers",
                timeout_s=self.deadline_s,
            )
        assert self.timeout_s is not None
        return ToolTimeoutError(
            f"call {message.call_id} of tool {message.function!r} got no result within its "
            f"timeout_s={self.timeout_s:g} (plus {report_grace_s(self.timeout_s):g}s for the "
            f"worker to report); it was revoked. Raise call_params.timeout_s or add workers",
            timeout_s=self.timeout_s,
        )


def _smallest(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None
