"""The one-call transaction of ``Branch.act()`` (ADR-0012 C1 to C4, C6).

Per call, in this order: normalize (its tool and arguments, :func:`open_call`) → gate
(``authorize``) → TOOL_PRE → the JSON contract (:func:`check_wire`) → enqueue and wait for its
record, retrying FAILED attempts (:meth:`Transaction.execute`). The result is a history
``Unit`` (``toolfleet.dispatcher.batch.units``); writing it, in input order, is
``toolfleet.dispatcher.batch.writer``'s job.

A call that needs approval is parked after the JSON contract and enqueued only once approved
(``toolfleet.dispatcher.batch.approval_step``). A call refused on the way is never enqueued:
it ends ABORTED (C3) or, when the gate or its approver denied it, SKIPPED (D2). Every refusal
goes through :func:`open_call`, :func:`abort` or a unit builder, so a refused call is recorded,
and its arguments redacted, one way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from toolfleet.broker import tracing
from toolfleet.dispatcher.accept.admission import Item
from toolfleet.dispatcher.accept.context import CallContext
from toolfleet.dispatcher.batch.approval_step import seek_approval
from toolfleet.dispatcher.batch.deadline import Deadline
from toolfleet.dispatcher.batch.opening import open_call
from toolfleet.dispatcher.batch.progress_relay import ProgressRelay
from toolfleet.dispatcher.batch.units import (
    HOOK_SUMMARY_CHARS,
    aborted_unit,
    denied_unit,
    finished_unit,
    history_record,
    unapproved_unit,
)
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.approvals import Escalate
from toolfleet.dispatcher.govern.emitter import Emitter
from toolfleet.dispatcher.govern.hooks import HookBus
from toolfleet.dispatcher.govern.session_signals import GateDenied
from toolfleet.dispatcher.history.history import Unit
from toolfleet.dispatcher.history.recorder import SignalSink
from toolfleet.dispatcher.send.approval_events import announce_approval
from toolfleet.dispatcher.send.cancel import StragglerBuffer, stopped_result
from toolfleet.dispatcher.send.publisher import Publisher
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.contract import check_arguments
from toolfleet.schemas.errors import (
    ApprovalRequired,
    ArgumentValidationError,
    BrokerError,
    CallLostError,
    NoWorkerError,
    ToolInterruptedError,
    ToolTimeoutError,
)
from toolfleet.schemas.limits import limit_fields
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallMessage, CallResult

__all__ = [
    "Authorize",
    "Transaction",
    "call_message",
    "check_wire",
]

# verbose_action=True logs each call under act()'s logger name.
log = logging.getLogger("toolfleet.dispatcher.batch.act")

# The ADR's observability budget for verbose argument previews.
VERBOSE_PREVIEW_CHARS = 50

# None: allowed; a string: denied, and why; Escalate: allowed once someone approves it.
Authorize = Callable[[CallContext], Awaitable[str | Escalate | None]]


def call_message(ctx: CallContext, **fields: Any) -> CallMessage:
    """The message that enqueues ``ctx``'s call (``fields``: attempt, reply_to, batch_id, ...)."""
    return CallMessage(
        call_id=ctx.call_id,
        tool_call_id=ctx.tool_call_id,
        branch_id=ctx.branch_id,
        function=ctx.function,
        arguments=ctx.arguments,
        **fields,
    )


def check_wire(ctx: CallContext, max_argument_bytes: int) -> None:
    """Hold the call to the JSON contract (toolfleet.schemas.contract) before it is enqueued; the
    worker checks the same contract again on receipt."""
    check_arguments(ctx.function, ctx.arguments, max_bytes=max_argument_bytes)


class Transaction:
    """Runs one call at a time through the transaction; one per batch, shared by its calls.

    ``contexts`` (by input index) and ``inflight`` (by call_id) hold the calls that are past
    normalizing and not yet finished, so a cancelled batch can record and stop them.
    """

    def __init__(
        self,
        fleet: Fleet,
        params: CallParams,
        *,
        branch_id: str,
        batch_id: str,
        authorize: Authorize,
        hooks: HookBus,
        signal: SignalSink,
        suppress_errors: bool,
        verbose: bool,
        stopped: Callable[[], bool],
        progress: ProgressRelay | None = None,
        session_id: str | None = None,
    ) -> None:
        self.fleet = fleet
        self.params = params
        self.branch_id = branch_id
        self.batch_id = batch_id
        self._authorize = authorize
        self._hooks = hooks
        self._signal = signal
        self._emitter = Emitter(signal, owner=f"branch {branch_id}")
        self.suppress = suppress_errors
        self._verbose = verbose
        self._stopped = stopped
        # Set when someone listens for progress: each call's message asks for reports.
        self.progress = progress
        # The branch's session (for a tool whose limits count per session).
        self.session_id = session_id
        self.deadline = Deadline.start(params)
        self.publisher = Publisher(fleet, bundle_size=params.bundle_size)
        self._settler = StragglerBuffer(fleet)
        self.contexts: dict[int, CallContext] = {}
        self.inflight: dict[str, CallMessage] = {}
        self._throttle_lock = asyncio.Lock()
        self._last_start_s: float | None = None

    def abort(
        self,
        ctx: CallContext,
        exc: BaseException,
        *,
        events: list[EventRecord] | None = None,
    ) -> Unit:
        """The ABORTED unit of a call stopped before (or while) enqueuing (C3)."""
        return aborted_unit(ctx, exc, raise_after=not self.suppress, events=events)

    async def run(self, item: Item, index: int, call_id: str) -> Unit:
        """The whole transaction of one call, inside its span (the parent of its worker's)."""
        with tracing.span("toolfleet.call", kind="producer") as span:
            unit = await self._transact(item, index, call_id)
            if span is not None:
                result = unit.result
                last = unit.events[-1] if unit.events else None
                span.update_name(f"toolfleet.call {result.function}")
                tracing.set_call_status(
                    span,
                    result.status,
                    error_type=None if result.error_info is None else result.error_info.type,
                    function=result.function,
                    call_id=result.call_id,
                    tool_call_id=result.tool_call_id,
                    branch_id=self.branch_id,
                    worker=last.worker if last is not None else None,
                    attempt=last.attempt if last is not None else None,
                )
            return unit

    async def _transact(self, item: Item, index: int, call_id: str) -> Unit:
        opened = open_call(item, self.fleet, self.branch_id, call_id, raise_after=not self.suppress)
        if isinstance(opened, Unit):
            return opened
        ctx = opened
        self.contexts[index] = ctx
        if self._verbose:
            log.info(
                "branch %s: call %s %s(%s)",
                self.branch_id,
                ctx.call_id,
                ctx.function,
                str(ctx.public_arguments)[:VERBOSE_PREVIEW_CHARS],
            )

        verdict = await self._authorize(ctx)
        escalation: str | None = None
        if isinstance(verdict, Escalate):
            escalation = verdict.reason
        elif verdict is not None:
            self._signal(GateDenied(ctx.call_id, ctx.function, ctx.branch_id, verdict))
            return denied_unit(ctx)
        assert ctx.tool is not None
        if ctx.tool.approval and escalation is None:
            escalation = f"tool {ctx.function!r} is declared approval=True"

        hooks_asked = False
        try:
            await self._emit_pre(ctx)
        except ApprovalRequired as exc:
            escalation, hooks_asked = str(exc) or "a TOOL_PRE hook asked for approval", True
        except Exception as exc:
            return self.abort(ctx, exc)  # C3

        try:
            check_wire(ctx, self.fleet.settings.max_argument_bytes)
        except ArgumentValidationError as exc:
            return self.abort(ctx, exc)

        if escalation is not None:
            refused = await self._approve(ctx, escalation, hooks_asked)
            if refused is not None:
                return refused
        return await self.execute(ctx)

    async def _emit_pre(self, ctx: CallContext) -> None:
        payload = {
            "tool_name": ctx.function,
            "call_id": ctx.call_id,
            "arguments": str(ctx.public_arguments)[:HOOK_SUMMARY_CHARS],
            "branch_id": self.branch_id,
            # No raw secret in any hook payload, the context included.
            "context": ctx.for_hooks(),
        }
        if ctx.approval is not None:
            payload["approval"] = ctx.approval
        await self._hooks.emit_pre(payload)

    async def _approve(self, ctx: CallContext, reason: str, hooks_asked: bool) -> Unit | None:
        """Park the call until someone decides (docs/controls.md); None once it is approved,
        else its unit: not run, with the decision the model reads."""
        assert ctx.tool is not None
        wait_s = self.params.approval_timeout_s
        remaining_s = self.deadline.remaining_s()
        if remaining_s is not None:
            wait_s = min(wait_s, remaining_s)
        message = self._message(ctx, 0)
        try:
            decided = await seek_approval(
                self.fleet, ctx.tool, message, reason=reason, wait_s=wait_s, emitter=self._emitter
            )
        except BrokerError as exc:
            return self.abort(ctx, exc)
        ctx.approval = decided.decision()
        if not decided.approved:
            return unapproved_unit(ctx, decided.refusal_text())
        if hooks_asked:
            # The hook that asked sees payload["approval"] this time; every TOOL_PRE hook
            # judges the call again, as it is now, after the wait.
            try:
                await self._emit_pre(ctx)
            except Exception as exc:
                await announce_approval(self.fleet, ctx.tool, message, "refused", str(exc))
                return self.abort(ctx, exc)
        return None

    async def execute(self, ctx: CallContext) -> Unit:
        """Enqueue the call and wait for its record; re-run FAILED attempts per CallParams."""
        if self.progress is None:
            return await self._attempts(ctx)
        self.fleet.collector.listen(ctx.call_id, self.progress.push)
        try:
            return await self._attempts(ctx)
        finally:
            self.fleet.collector.unlisten(ctx.call_id)

    async def _attempts(self, ctx: CallContext) -> Unit:
        events: list[EventRecord] = []
        delay_s = self.params.retry_initial_delay_s
        attempt = 0
        while True:
            await self._throttle()
            try:
                result = await self._execute_once(ctx, attempt)
            except BrokerError as exc:
                return self.abort(ctx, exc, events=events)
            events.append(history_record(ctx, result))
            if (
                result.status is EventStatus.FAILED
                and not _paused(result)
                and attempt < self.params.retry_attempts
                and not self._stopped()
                and not self.deadline.expired()
            ):
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                delay_s *= self.params.retry_backoff
                attempt += 1
                continue
            return finished_unit(ctx, result, events)

    def _message(self, ctx: CallContext, attempt: int) -> CallMessage:
        assert ctx.tool is not None
        return call_message(
            ctx,
            timeout_s=self.params.timeout_s,
            attempt=attempt,
            reply_to=self.fleet.reply_key,
            batch_id=self.batch_id,
            progress=self.progress is not None,
            **limit_fields(ctx.tool, self.params.limit_wait_s, self.session_id),
        )

    async def _execute_once(self, ctx: CallContext, attempt: int) -> CallResult:
        assert ctx.tool is not None
        message = self._message(ctx, attempt)
        if self.deadline.expired():
            # The batch deadline passed while this call waited for the window: never enqueued.
            error = self.deadline.error(message, by_batch=True)
            return stopped_result(message, ctx.tool, error, EventStatus.FAILED)
        future = self.fleet.expect(ctx.call_id, attempt)
        self.inflight[ctx.call_id] = message
        try:
            await self.publisher.submit(message, ctx.tool)
        except BaseException:
            self.fleet.collector.forget(ctx.call_id, attempt)
            if future.done() and not future.cancelled():
                future.exception()  # failed meanwhile (the broker watch); awaited by no one
            raise
        try:
            result = await self.deadline.wait(future, message)
        except (ToolTimeoutError, BrokerError, NoWorkerError, CallLostError) as exc:
            # A straggler, a call the broker lost (toolfleet.dispatcher.watch.broker_watch), one no
            # worker serves or one lost twice (toolfleet.dispatcher.watch.reconciler): recorded
            # FAILED and revoked, so the batch can return instead of waiting forever.
            self.fleet.collector.forget(ctx.call_id, attempt)
            result = await self._settler.settle(message, ctx.tool, exc)
        except BaseException:
            self.fleet.collector.forget(ctx.call_id, attempt)
            raise
        self.inflight.pop(ctx.call_id, None)
        return result

    async def _throttle(self) -> None:
        period_s = self.params.throttle_period_s
        if period_s is None:
            return
        async with self._throttle_lock:
            now_s = time.monotonic()
            if self._last_start_s is not None:
                wait_s = self._last_start_s + period_s - now_s
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
            self._last_start_s = time.monotonic()


def _paused(result: CallResult) -> bool:
    """The call's tool stopped at a LangGraph ``interrupt()``: it waits for a resume value, and
    running it again without one would only stop it there again, so it is not retried."""
    error = (result.event.get("execution") or {}).get("error")
    return isinstance(error, dict) and error.get("error") == ToolInterruptedError.__name__
