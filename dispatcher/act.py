"""One ``Branch.act()`` batch: the per-call transaction and the in-order writer.

Per call: CallContext (C4) → authorize → TOOL_PRE → wire checks → enqueue → result (with
retries). Per call, in input order, once every earlier call is written: TOOL_POST or
TOOL_ERROR → event records + linked ActionRequest/ActionResponse as one unit (C5) →
observers and message callbacks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

from dispatcher.cancel import Settler, cancelled_error, settle_calls, stopped_result
from dispatcher.context import CallContext, call_id_for, new_call_id
from dispatcher.deadline import Deadline
from dispatcher.envelope import Envelope, normalize
from dispatcher.history import Unit, link_pair
from dispatcher.hooks import HookPoint
from dispatcher.journal import BatchJournal
from dispatcher.publisher import Publisher
from dispatcher.signals import GateDenied
from schemas import tracing
from schemas.action import ActionResponseModel, CallParams
from schemas.contract import check_arguments, safe_repr, safe_text
from schemas.errors import (
    ArgumentValidationError,
    BrokerError,
    CallLostError,
    ConfigurationError,
    MalformedRequestError,
    NoWorkerError,
    ToolTimeoutError,
    UnknownToolError,
)
from schemas.function_calling import REDACTED, normalize_arguments
from schemas.messages import ActionRequest, ActionResponse
from schemas.record import EventRecord
from schemas.serialize import format_error, to_jsonable
from schemas.status import EventStatus
from schemas.wire import CallMessage, CallResult

if TYPE_CHECKING:
    from dispatcher.branch import Branch
    from dispatcher.fleet import Fleet

__all__ = ["DENIED_OUTPUT_ERROR", "STRATEGIES", "Batch", "Strategy"]

log = logging.getLogger(__name__)

Strategy = Literal["concurrent", "sequential"]
STRATEGIES: tuple[str, ...] = ("concurrent", "sequential")
DENIED_OUTPUT_ERROR = "denied by governance gate"
# The ADR's observability budgets for hook summaries and verbose argument previews.
HOOK_SUMMARY_CHARS = 200
VERBOSE_PREVIEW_CHARS = 50

_MANAGER_ERRORS = (ArgumentValidationError, UnknownToolError, BrokerError)


class Batch:
    """Runs one act() call; construct, then ``await run()``."""

    def __init__(
        self,
        branch: Branch,
        fleet: Fleet,
        requests: Any,
        *,
        strategy: str,
        verbose_action: bool,
        suppress_errors: bool,
        call_params: CallParams | None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ConfigurationError(
                f"strategy {strategy!r} is not one of {list(STRATEGIES)}; pass 'concurrent' "
                "to run calls in parallel or 'sequential' to run them one after another"
            )
        self.branch = branch
        self.fleet = fleet
        self.strategy = strategy
        self.verbose = verbose_action
        self.suppress = suppress_errors
        self.params = call_params if call_params is not None else CallParams()
        self.items = self._envelopes(requests)
        window = self.params.max_concurrent or fleet.settings.max_in_flight
        self._window = asyncio.Semaphore(window)
        self._publisher = Publisher(fleet, batch_size=self.params.batch_size)
        self._ready: dict[int, Unit | None] = {}
        self._next_write = 0
        self._write_lock = asyncio.Lock()
        self._writing: asyncio.Future[None] | None = None
        self._stopped = False
        self._throttle_lock = asyncio.Lock()
        self._last_start_s: float | None = None
        # Deadlines and cancellation (issue 7): the batch clock starts now; the contexts and
        # in-flight messages let a cancelled batch record and revoke what is unfinished.
        self._deadline = Deadline.start(self.params)
        self._settler = Settler(fleet)
        self._contexts: dict[int, CallContext] = {}
        self._inflight: dict[str, CallMessage] = {}
        # Issue 12: call ids are fixed up front, so the journal lists every call before the
        # first is enqueued, and each call's record names its batch.
        self.batch_id = new_call_id()
        self._call_ids = [initial_call_id(item, branch.id) for item in self.items]
        self._journal = BatchJournal(self, fleet)

    def _envelopes(self, requests: Any) -> list[Envelope | MalformedRequestError]:
        if not isinstance(requests, list | tuple):
            requests = [requests]
        items: list[Envelope | MalformedRequestError] = []
        seen: dict[str, int] = {}
        for index, request in enumerate(requests):
            try:
                item = normalize(request)
                if item.tool_call_id is not None:
                    first = seen.setdefault(item.tool_call_id, index)
                    if first != index:
                        # One id, one result: the provider could not pair two answers.
                        duplicate = MalformedRequestError(
                            f"tool_call_id {item.tool_call_id!r} of call {index} already names "
                            f"call {first} of this batch; give each call its own id"
                        )
                        duplicate.tool_call_id = item.tool_call_id
                        raise duplicate
                items.append(item)
            except MalformedRequestError as exc:
                if not self.suppress:
                    raise  # before anything in the batch is enqueued
                items.append(exc)
        return items

    # -- batch -------------------------------------------------------------------------

    def _call_id(self, index: int) -> str:
        return self._call_ids[index] if 0 <= index < len(self._call_ids) else new_call_id()

    async def run(self) -> list[Any]:
        await self._journal.start(self._call_ids)
        try:
            if self.strategy == "sequential":
                units = await self._run_sequential()
            else:
                units = await self._run_concurrent()
        except BaseException:
            # C9: cancelled (or a cancellation-class BaseException escaped a hook): every
            # unfinished call is recorded CANCELLED and stopped on the fleet before the
            # exception goes on. Shielded, so a second cancel cannot leave it half-recorded.
            await asyncio.shield(self._finish_cancelled())
            raise
        finally:
            await self._publisher.aclose()
        await self._journal.finish()
        results: list[Any] = []
        first_error: BaseException | None = None
        for unit in units:
            if unit is None:
                results.append(None)
            elif unit.raise_after is not None and self.params.return_exceptions:
                results.append(unit.raise_after)
            else:
                if unit.raise_after is not None and first_error is None:
                    first_error = unit.raise_after
                results.append(unit.result)
        if first_error is not None:
            raise first_error
        if self.params.output_dropna:
            results = [r for r in results if r is not None]
        return results

    async def _run_sequential(self) -> list[Unit | None]:
        units: list[Unit | None] = [None] * len(self.items)
        for index, item in enumerate(self.items):
            unit = await self._traced(item, index)
            units[index] = unit
            await self._complete(index, unit)
            if self._stops_batch(unit):
                break
        return units

    async def _run_concurrent(self) -> list[Unit | None]:
        # A task exists only for a call inside the window (C8), so a 100,000-call batch holds
        # `window` tasks at a time, not one per call waiting on the semaphore.
        units: list[Unit | None] = [None] * len(self.items)
        running: set[asyncio.Task[None]] = set()
        failed: list[asyncio.Task[None]] = []

        def done(task: asyncio.Task[None]) -> None:
            running.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failed.append(task)

        try:
            for index, item in enumerate(self.items):
                await self._window.acquire()
                if failed:
                    self._window.release()
                    break
                task = asyncio.ensure_future(self._windowed(index, item, units))
                running.add(task)
                task.add_done_callback(done)
            while running:
                await asyncio.wait(set(running), return_when=asyncio.FIRST_EXCEPTION)
                if failed:
                    break
            if failed:
                raise cast(BaseException, failed[0].exception())
        except BaseException:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise
        return units

    async def _windowed(
        self, index: int, item: Envelope | MalformedRequestError, units: list[Unit | None]
    ) -> None:
        try:
            unit = None if self._stopped else await self._traced(item, index)
        finally:
            self._window.release()
        units[index] = unit
        if unit is not None and self._stops_batch(unit):
            self._stopped = True
        await self._complete(index, unit)

    def _stops_batch(self, unit: Unit | None) -> bool:
        return (
            unit is not None and unit.raise_after is not None and not self.params.return_exceptions
        )

    async def _complete(self, index: int, unit: Unit | None) -> None:
        """Hold ``unit`` until every earlier call is written, then write the ready run."""
        self._ready[index] = unit
        async with self._write_lock:
            await self._landed()
            run: list[Unit] = []
            before = self._next_write
            while self._next_write in self._ready:
                ready = self._ready.pop(self._next_write)
                # Written calls need no context (only unwritten ones are ever cancelled), so
                # a long batch does not keep one per call.
                self._contexts.pop(self._next_write, None)
                self._next_write += 1
                if ready is not None:
                    run.append(ready)
            if run:
                await self._write(run, self._progress(before, self._next_write))

    def _progress(self, before: int, after: int) -> tuple[str, int, int]:
        """The journal's written count moving from ``before`` to ``after`` with a write."""
        return (self._journal.progress_key, before, after)

    async def _write(self, run: list[Unit], progress: tuple[str, int, int]) -> None:
        """Write ``run`` shielded: a cancelled caller cannot cut a unit in half (C5)."""
        self._writing = asyncio.ensure_future(
            self.branch._write_units(run, self.fleet, progress=progress)
        )
        await asyncio.shield(self._writing)
        self._writing = None

    async def _landed(self) -> None:
        """Wait for a write whose task was cancelled mid-way, so units land in input order."""
        if self._writing is not None:
            await asyncio.shield(self._writing)
            self._writing = None

    # -- one call ----------------------------------------------------------------------

    async def _traced(self, item: Envelope | MalformedRequestError, index: int) -> Unit:
        """``_transact`` inside the call's span, the parent of its worker's span."""
        with tracing.span("toolfleet.call", kind="producer") as span:
            unit = await self._transact(item, index)
            if span is not None:
                result = unit.result
                last = EventRecord.from_dict(unit.events[-1]) if unit.events else None
                span.update_name(f"toolfleet.call {result.function}")
                tracing.set_call_status(
                    span,
                    result.status,
                    error=result.error,
                    function=result.function,
                    call_id=result.call_id,
                    tool_call_id=result.tool_call_id,
                    branch_id=self.branch.id,
                    worker=last.worker if last is not None else None,
                    attempt=last.attempt if last is not None else None,
                )
            return unit

    async def _transact(self, item: Envelope | MalformedRequestError, index: int = -1) -> Unit:
        branch_id = self.branch.id
        call_id = self._call_id(index)
        if isinstance(item, MalformedRequestError):
            return self._aborted(_context(item, branch_id, "", {}, call_id), item, hook=False)
        try:
            tool = self._tool_for(item)
            arguments = normalize_arguments(tool, item.arguments)
        except Exception as exc:
            return self._aborted(self._refused_context(item, call_id), _refusal(item, exc))
        ctx = _context(item, branch_id, item.function, arguments, call_id, tool)
        self._contexts[index] = ctx
        if self.verbose:
            log.info(
                "branch %s: call %s %s(%s)",
                branch_id,
                ctx.call_id,
                ctx.function,
                str(ctx.public_arguments)[:VERBOSE_PREVIEW_CHARS],
            )

        reason = await self.branch.authorize(ctx)
        if reason is not None:
            return self._denied(ctx, reason)

        try:
            await self.branch.hooks.emit_pre(
                {
                    "tool_name": ctx.function,
                    "call_id": ctx.call_id,
                    "arguments": str(ctx.public_arguments)[:HOOK_SUMMARY_CHARS],
                    "branch_id": branch_id,
                    "context": ctx,
                }
            )
        except Exception as exc:
            return self._aborted(ctx, exc)  # C3

        try:
            check_wire(ctx, self.fleet.settings.max_argument_bytes)
        except ArgumentValidationError as exc:
            return self._aborted(ctx, exc)

        return await self._execute_with_retries(ctx)

    async def _execute_with_retries(self, ctx: CallContext) -> Unit:
        events: list[dict[str, Any]] = []
        delay_s = self.params.retry_initial_delay_s
        attempt = 0
        while True:
            await self._throttle()
            try:
                result = await self._execute_once(ctx, attempt)
            except BrokerError as exc:
                return self._aborted(ctx, exc, events=events)
            events.append(self._record(ctx, result))
            if (
                result.status is EventStatus.FAILED
                and attempt < self.params.retry_attempts
                and not self._stopped
                and not self._deadline.expired()
            ):
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                delay_s *= self.params.retry_backoff
                attempt += 1
                continue
            return self._finished(ctx, result, events)

    async def _execute_once(self, ctx: CallContext, attempt: int) -> CallResult:
        assert ctx.tool is not None
        message = _message(
            ctx,
            timeout_s=self.params.timeout_s,
            attempt=attempt,
            reply_to=self.fleet.reply_key,
            batch_id=self.batch_id,
        )
        if self._deadline.expired():
            # The batch deadline passed while this call waited for the window: never enqueued.
            error = self._deadline.error(message, by_batch=True)
            return stopped_result(message, ctx.tool, error, EventStatus.FAILED)
        future = self.fleet.expect(ctx.call_id, attempt)
        self._inflight[ctx.call_id] = message
        try:
            await self._publisher.submit(message, ctx.tool)
        except BaseException:
            self.fleet.collector.forget(ctx.call_id, attempt)
            raise
        try:
            result = await self._deadline.wait(future, message)
        except (ToolTimeoutError, BrokerError, NoWorkerError, CallLostError) as exc:
            # A straggler, a call the broker lost (dispatcher.broker_watch), one no worker
            # serves or one lost twice (dispatcher.reconciler): recorded FAILED and revoked,
            # so the batch can return (issues 7, 12).
            self.fleet.collector.forget(ctx.call_id, attempt)
            result = await self._settler.settle(message, ctx.tool, exc)
        except BaseException:
            self.fleet.collector.forget(ctx.call_id, attempt)
            raise
        self._inflight.pop(ctx.call_id, None)
        return result

    async def _finish_cancelled(self) -> None:
        """C9: write every call not yet written, in input order, then let CancelledError go.

        Finished calls keep their results; every unfinished call is recorded CANCELLED
        (queued ones revoked, running async ones cancelled on their workers).
        """
        async with self._write_lock:
            await self._landed()
            stopped: list[tuple[int, CallContext, CallMessage]] = []
            units: dict[int, Unit | None] = {}
            for index in range(self._next_write, len(self.items)):
                if index in self._ready:
                    units[index] = self._ready.pop(index)
                    continue
                ctx = self._contexts.get(index)
                if ctx is None:
                    units[index] = self._unstarted_unit(self.items[index], index)
                    continue
                message = self._inflight.get(ctx.call_id) or _message(ctx, batch_id=self.batch_id)
                stopped.append((index, ctx, message))
            records = await settle_calls(
                self.fleet,
                [(message, ctx.tool) for _, ctx, message in stopped],
                cancelled_error,
                EventStatus.CANCELLED,
            )
            for index, ctx, message in stopped:
                result = records[message.call_id]
                units[index] = self._finished(ctx, result, [self._record(ctx, result)])
            before, self._next_write = self._next_write, len(self.items)
            ordered = [u for _, u in sorted(units.items()) if u is not None]
            if ordered:
                await self.branch._write_units(
                    ordered, self.fleet, progress=self._progress(before, self._next_write)
                )
            await self._journal.finish()

    def _unstarted_unit(self, item: Envelope | MalformedRequestError, index: int) -> Unit:
        """The unit of a call cancelled before its transaction began (it waited for the window)."""
        branch_id = self.branch.id
        call_id = self._call_id(index)
        if isinstance(item, MalformedRequestError):
            return self._aborted(_context(item, branch_id, "", {}, call_id), item, hook=False)
        try:
            tool = self._tool_for(item)
            arguments = normalize_arguments(tool, item.arguments)
        except Exception as exc:
            return self._aborted(self._refused_context(item, call_id), _refusal(item, exc))
        ctx = _context(item, branch_id, item.function, arguments, call_id, tool)
        message = _message(ctx, batch_id=self.batch_id)
        result = stopped_result(message, tool, cancelled_error(message), EventStatus.CANCELLED)
        return self._finished(ctx, result, [self._record(ctx, result)])

    def _refused_context(self, item: Envelope, call_id: str) -> CallContext:
        """The context of a call refused before it was normalized: whatever the caller
        passed (lone surrogates, non-string keys, raising mappings), it can be recorded."""
        function = safe_text(item.function)
        try:
            raw = dict(item.arguments) if isinstance(item.arguments, Mapping) else {}
        except Exception:
            raw = {}
        if item.function in self.fleet.registry:
            known = self.fleet.tool(item.function)
            return _context(item, self.branch.id, function, raw, call_id, known)
        # No tool, no list of secret arguments: keep the names, hide every value.
        hidden = to_jsonable(dict.fromkeys(raw, REDACTED))
        public = hidden if isinstance(hidden, dict) else {}
        return _context(item, self.branch.id, function, public, call_id)

    def _tool_for(self, item: Envelope) -> Any:
        if item.arguments_error is not None:
            # JSON-string arguments that did not decode: this call's error alone.
            raise ArgumentValidationError(item.arguments_error)
        return self.fleet.tool(item.function)

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

    # -- units -------------------------------------------------------------------------

    def _record(self, ctx: CallContext, result: CallResult) -> dict[str, Any]:
        record = EventRecord.from_dict(result.event).in_history(
            call_id=ctx.call_id,
            tool_call_id=ctx.tool_call_id,
            branch_id=ctx.branch_id,
            attempt=result.attempt,
            worker=result.worker,
        )
        return record.to_dict()

    def _finished(self, ctx: CallContext, result: CallResult, events: list[dict[str, Any]]) -> Unit:
        execution = result.to_execution()
        status = execution.status
        output = execution.response
        error = None if status is EventStatus.COMPLETED else _error_text(execution.error, status)
        arguments = ctx.public_arguments
        request, response, model = _answer(ctx, arguments, output, status, error)
        return Unit(
            call_id=ctx.call_id,
            events=events,
            request=request,
            response=response,
            result=model,
            hook_point=HookPoint.TOOL_POST,
            hook_payload={
                "call_id": ctx.call_id,
                "tool_name": ctx.function,
                "response": str(output)[:HOOK_SUMMARY_CHARS],
                "duration": execution.duration,
                "status": status,
                "error": error,
                "branch_id": ctx.branch_id,
            },
        )

    def _denied(self, ctx: CallContext, reason: str) -> Unit:
        self.branch._signal(GateDenied(ctx.call_id, ctx.function, ctx.branch_id, reason))
        output = {"error": DENIED_OUTPUT_ERROR, "function": ctx.function}
        arguments = ctx.public_arguments
        request, response, model = _answer(
            ctx, arguments, output, EventStatus.SKIPPED, DENIED_OUTPUT_ERROR
        )
        # Denial is a value whatever suppress_errors says; no event, no hook.
        return Unit(ctx.call_id, [], request, response, model)

    def _aborted(
        self,
        ctx: CallContext,
        exc: BaseException,
        *,
        hook: bool = True,
        events: list[dict[str, Any]] | None = None,
    ) -> Unit:
        """A call stopped before (or while) enqueuing: ABORTED event, error pair (C3)."""
        error = format_error(exc)
        arguments = ctx.public_arguments
        output = {"error": error, "function": ctx.function, "arguments": arguments}
        record = EventRecord.not_run(
            ctx.function,
            arguments,
            exc,
            status=EventStatus.ABORTED,
            secret_args=ctx.secret_args,
            duration_s=None,  # never enqueued: no duration at all (C3)
        ).in_history(
            call_id=ctx.call_id,
            tool_call_id=ctx.tool_call_id,
            branch_id=ctx.branch_id,
            attempt=len(events or ()),
            worker=None,
        )
        request, response, model = _answer(ctx, arguments, output, EventStatus.ABORTED, error)
        return Unit(
            call_id=ctx.call_id,
            events=[*(events or ()), record.to_dict()],
            request=request,
            response=response,
            result=model,
            raise_after=None if self.suppress else exc,
            hook_point=HookPoint.TOOL_ERROR if hook else None,
            hook_payload={
                "call_id": ctx.call_id,
                "tool_name": ctx.function,
                "error": exc,
                "duration": None,
                "branch_id": ctx.branch_id,
            },
        )


def initial_call_id(item: Envelope | MalformedRequestError, branch_id: str | None) -> str:
    """A call's id, fixed before the batch runs (the journal lists it): derived from the
    model's tool_call_id when it gave one."""
    if isinstance(item, MalformedRequestError):
        # Never enqueued, so no idempotency to keep; a fresh id cannot collide with a
        # valid call of the same tool_call_id (a duplicate in the batch).
        return new_call_id()
    return call_id_for(branch_id, item.tool_call_id)


def _context(
    item: Envelope | MalformedRequestError,
    branch_id: str | None,
    function: str,
    arguments: dict[str, Any],
    call_id: str,
    tool: Any = None,
) -> CallContext:
    """A call's context, its ids taken from the model's tool_call_id when it gave one."""
    tool_call_id = item.tool_call_id
    request = None if isinstance(item, MalformedRequestError) else item.request
    return CallContext(
        function,
        arguments,
        branch_id,
        call_id=call_id,
        tool=tool,
        tool_call_id=tool_call_id or "",
        request=request,
    )


def _message(ctx: CallContext, **fields: Any) -> CallMessage:
    return CallMessage(
        call_id=ctx.call_id,
        tool_call_id=ctx.tool_call_id,
        branch_id=ctx.branch_id,
        function=ctx.function,
        arguments=ctx.arguments,
        **fields,
    )


def check_wire(ctx: CallContext, max_argument_bytes: int) -> None:
    """Hold the call to the JSON contract (schemas.contract) before it is enqueued; the
    worker checks the same contract again on receipt."""
    check_arguments(ctx.function, ctx.arguments, max_bytes=max_argument_bytes)


def _refusal(item: Envelope, exc: Exception) -> Exception:
    """A toolfleet error for a call refused before enqueue, whatever normalizing raised."""
    if isinstance(exc, ArgumentValidationError | UnknownToolError):
        return exc
    return ArgumentValidationError(
        f"arguments for tool {safe_repr(item.function)} could not be read "
        f"({format_error(exc)}); pass a dict of JSON values"
    )


def _error_text(error: str | BaseException | None, status: EventStatus) -> str:
    if error is None:
        return f"{status.value} without a recorded error"
    if isinstance(error, BaseException):
        return format_error(error)
    return error


def _answer(
    ctx: CallContext,
    arguments: dict[str, Any],
    output: Any,
    status: EventStatus,
    error: str | None,
) -> tuple[ActionRequest, ActionResponse, ActionResponseModel]:
    """The linked message pair and the returned model of one call: the same facts, three views."""
    request, response = link_pair(
        function=ctx.function,
        arguments=arguments,
        output=output,
        error=error,
        branch_id=ctx.branch_id,
        call_id=ctx.call_id,
        tool_call_id=ctx.tool_call_id,
        request=ctx.request,
    )
    model = ActionResponseModel(
        function=ctx.function,
        arguments=arguments,
        output=output,
        status=status,
        error=error,
        call_id=ctx.call_id,
        tool_call_id=ctx.tool_call_id,
    )
    return request, response, model
