"""The one-call transaction of ``Branch.act()`` (ADR-0012 C1 to C4, C6).

Per call, in this order: normalize (its tool and arguments, :func:`open_call`) → gate
(``authorize``) → TOOL_PRE → the JSON contract (:func:`check_wire`) → enqueue and wait for its
record, retrying FAILED attempts (:meth:`Transaction.execute`). The result is a history
``Unit`` (``toolfleet.dispatcher.batch.units``); writing it, in input order, is
``toolfleet.dispatcher.batch.writer``'s job.

A call refused on the way is never enqueued: it ends ABORTED (C3) or, when the gate denied it,
SKIPPED (D2). Every refusal goes through :func:`open_call` or :func:`abort`, so a refused call
is recorded, and its arguments redacted, one way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from toolfleet.dispatcher.accept.context import CallContext, call_id_for, new_call_id
from toolfleet.dispatcher.accept.envelope import Envelope, custom_arguments
from toolfleet.dispatcher.batch.deadline import Deadline
from toolfleet.dispatcher.batch.units import (
    HOOK_SUMMARY_CHARS,
    aborted_unit,
    denied_unit,
    finished_unit,
    history_record,
)
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.hooks import HookBus
from toolfleet.dispatcher.govern.session_signals import GateDenied
from toolfleet.dispatcher.history.history import Unit
from toolfleet.dispatcher.history.recorder import SignalSink
from toolfleet.dispatcher.send.publisher import Publisher
from toolfleet.dispatcher.watch.cancel import StragglerBuffer, stopped_result
from toolfleet.dispatcher.watch.progress_relay import ProgressRelay
from toolfleet.schemas import tracing
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.contract import check_arguments, safe_repr, safe_text
from toolfleet.schemas.errors import (
    ArgumentValidationError,
    BrokerError,
    CallLostError,
    MalformedRequestError,
    NoWorkerError,
    ToolTimeoutError,
    UnknownToolError,
)
from toolfleet.schemas.function_calling import normalize_arguments
from toolfleet.schemas.limits import limit_fields
from toolfleet.schemas.record import EventRecord, bounded_arguments, shown_arguments
from toolfleet.schemas.serialize import format_error
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallMessage, CallResult

__all__ = [
    "Authorize",
    "Item",
    "Transaction",
    "call_message",
    "check_wire",
    "initial_call_id",
    "open_call",
]

# verbose_action=True logs each call under act()'s logger name.
log = logging.getLogger("toolfleet.dispatcher.batch.act")

# The ADR's observability budget for verbose argument previews.
VERBOSE_PREVIEW_CHARS = 50

Item = Envelope | MalformedRequestError
Authorize = Callable[[CallContext], Awaitable[str | None]]


def initial_call_id(item: Item, branch_id: str | None) -> str:
    """A call's id, fixed before the batch runs (the journal lists it): derived from the
    model's tool_call_id when it gave one."""
    if isinstance(item, MalformedRequestError):
        # Never enqueued, so no idempotency to keep; a fresh id cannot collide with a
        # valid call of the same tool_call_id (a duplicate in the batch).
        return new_call_id()
    return call_id_for(branch_id, item.tool_call_id)


def open_call(
    item: Item, fleet: Fleet, branch_id: str | None, call_id: str, *, raise_after: bool
) -> CallContext | Unit:
    """Normalize one request: its context, or the ABORTED unit of a call refused here
    (malformed request, unknown tool, unreadable or invalid arguments)."""
    if isinstance(item, MalformedRequestError):
        ctx = _context(item, branch_id, "", {}, call_id)
        return aborted_unit(ctx, item, raise_after=raise_after, hook=False)
    try:
        if item.arguments_error is not None:
            # JSON-string arguments that did not decode: this call's error alone.
            raise ArgumentValidationError(item.arguments_error)
        tool = fleet.tool(item.function)
        raw = item.arguments
        if item.tool_call_type == "custom":
            raw = custom_arguments(tool, raw)  # free-form text: the one string parameter
        arguments = normalize_arguments(tool, raw)
    except Exception as exc:
        ctx = _refused_context(item, fleet, branch_id, call_id)
        return aborted_unit(ctx, _refusal(item, exc), raise_after=raise_after)
    return _context(item, branch_id, item.function, arguments, call_id, tool)


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
                    error=result.error,
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

        reason = await self._authorize(ctx)
        if reason is not None:
            self._signal(GateDenied(ctx.call_id, ctx.function, ctx.branch_id, reason))
            return denied_unit(ctx)

        try:
            await self._hooks.emit_pre(
                {
                    "tool_name": ctx.function,
                    "call_id": ctx.call_id,
                    "arguments": str(ctx.public_arguments)[:HOOK_SUMMARY_CHARS],
                    "branch_id": self.branch_id,
                    # No raw secret in any hook payload, the context included.
                    "context": ctx.for_hooks(),
                }
            )
        except Exception as exc:
            return self.abort(ctx, exc)  # C3

        try:
            check_wire(ctx, self.fleet.settings.max_argument_bytes)
        except ArgumentValidationError as exc:
            return self.abort(ctx, exc)

        return await self.execute(ctx)

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

    async def _execute_once(self, ctx: CallContext, attempt: int) -> CallResult:
        assert ctx.tool is not None
        message = call_message(
            ctx,
            timeout_s=self.params.timeout_s,
            attempt=attempt,
            reply_to=self.fleet.reply_key,
            batch_id=self.batch_id,
            progress=self.progress is not None,
            **limit_fields(ctx.tool, self.params.limit_wait_s, self.session_id),
        )
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


def _context(
    item: Item,
    branch_id: str | None,
    function: str,
    arguments: dict[str, Any],
    call_id: str,
    tool: Any = None,
) -> CallContext:
    """A call's context, its ids taken from the model's tool_call_id when it gave one."""
    request = None if isinstance(item, MalformedRequestError) else item.request
    return CallContext(
        function,
        arguments,
        branch_id,
        call_id=call_id,
        tool=tool,
        tool_call_id=item.tool_call_id or "",
        request=request,
        tool_call_type="custom" if item.tool_call_type == "custom" else "function",
    )


def _refused_context(
    item: Envelope, fleet: Fleet, branch_id: str | None, call_id: str
) -> CallContext:
    """The context of a call refused before it was normalized: whatever the caller passed
    (lone surrogates, non-string keys, raising mappings), it can be recorded."""
    function = safe_text(item.function)
    known = fleet.tool(item.function) if item.function in fleet.registry else None
    # No tool here: the secrets the workers announced for it, else (None) none is known, so
    # keep the names and hide every value.
    secret = known.secret_args if known is not None else fleet.announced_secret_args(function)
    try:
        if isinstance(item.arguments, Mapping):
            raw = dict(item.arguments)
        elif isinstance(item.arguments, str):
            # The model's text that was not a JSON object: a bounded preview of it.
            raw = bounded_arguments(item.arguments, secret)
        else:
            raw = {}
    except Exception:
        raw = {}
    if known is not None:
        return _context(item, branch_id, function, raw, call_id, known)
    return _context(item, branch_id, function, shown_arguments(raw, secret), call_id)


def _refusal(item: Envelope, exc: Exception) -> Exception:
    """A toolfleet error for a call refused before enqueue, whatever normalizing raised."""
    if isinstance(exc, ArgumentValidationError | UnknownToolError):
        return exc
    return ArgumentValidationError(
        f"arguments for tool {safe_repr(item.function)} could not be read "
        f"({format_error(exc)}); pass a dict of JSON values"
    )
