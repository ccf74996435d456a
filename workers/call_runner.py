"""Running one call: one CallMessage in, its terminal record in Redis and an Outcome out.

:func:`execute_async` is the whole path (C7 start, the tool, the record), shared by the prefork
task (:mod:`toolfleet.workers.prefork_task`, on a per-process event loop), the asyncio pool (on its
loop thread) and batches (:mod:`toolfleet.workers.bundle`, through the batch's own
:class:`CallStore`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import ValidationError

from toolfleet.broker import tracing
from toolfleet.schemas.errors import (
    MalformedRequestError,
    RateLimitedError,
    RefusedCallError,
    ToolfleetError,
    ToolTimeoutError,
    UnknownToolError,
    WorkerLostError,
)
from toolfleet.schemas.function_calling import (
    GRAPH_RESUME_KEY,
    FunctionCalling,
    tool_arguments,
)
from toolfleet.schemas.record import not_run_result
from toolfleet.schemas.serialize import UNSERIALIZABLE
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tool import Tool, ToolKind
from toolfleet.schemas.wire import CallMessage, CallResult
from toolfleet.workers.alarm import per_call_alarm, sync_tool_deadline
from toolfleet.workers.current_call import CurrentCall, bind_call, running_message
from toolfleet.workers.failure import rebuild_error
from toolfleet.workers.graph_context import interrupted
from toolfleet.workers.guard import check_call, reply_to_problem
from toolfleet.workers.limits import acquire_limits, forget_slot, limits_client, release_limits
from toolfleet.workers.runtime import CallRuntime, CallStore
from toolfleet.workers.store import StartedMarker

__all__ = ["Outcome", "execute_async"]

# Poll period while a live duplicate delivery waits for the holder's terminal record.
_DUPLICATE_POLL_S = 0.2

log = logging.getLogger(__name__)
# The tools this process has warned about returning a value that is not JSON: once each.
_warned_unserializable: set[str] = set()


@dataclass(frozen=True, slots=True)
class Outcome:
    """A call's terminal record plus the exception Celery must see when it FAILED."""

    result: CallResult
    error: BaseException | None = None

    @property
    def status(self) -> EventStatus:
        return self.result.status


async def execute_async(
    message: dict[str, Any] | CallMessage,
    *,
    runtime: CallRuntime,
    hostname: str | None = None,
    limit_s: float | None = None,
    cancel_is_final: Callable[[], bool] = lambda: True,
    pool: ToolKind | None = None,
    trace: Any = None,
) -> Outcome:
    """Run one call with C7 idempotency and worker-loss detection; store and signal its record.

    ``limit_s`` (a task time limit) caps the tool's own timeout_s. Cancellation ends the call
    CANCELLED when ``cancel_is_final()`` (a user cancel); otherwise (worker shutdown) it
    propagates and leaves the started marker, so a redelivery applies the worker-lost rule.
    ``pool`` is the kind of pool running this (None skips the kind check, toolfleet.workers.guard).
    ``trace``: the message's ``toolfleet.broker.tracing.TRACE_HEADER`` value, so the worker's span
    joins the dispatcher's trace.
    """
    msg = _parse(message)
    host = hostname or _default_hostname()
    with tracing.worker_span(msg, host, trace) as span:
        token = running_message.set(msg)
        try:
            outcome = await _execute(msg, runtime, host, limit_s, cancel_is_final, pool)
        except asyncio.CancelledError as exc:
            # Cancelled before the tool started (e.g. waiting on Redis): still record it.
            if not cancel_is_final():
                raise
            store = runtime.async_store()
            outcome = await asyncio.shield(
                _finish_failed(store, msg, None, exc, host, status=EventStatus.CANCELLED)
            )
        finally:
            running_message.reset(token)
        tracing.set_result_status(span, outcome.result)
        return outcome


async def _execute(
    msg: CallMessage,
    runtime: CallRuntime,
    hostname: str,
    limit_s: float | None,
    cancel_is_final: Callable[[], bool],
    pool: ToolKind | None = None,
) -> Outcome:
    store = runtime.async_store()
    foreign = reply_to_problem(msg.reply_to, runtime.keys)
    if foreign is not None:
        # Never push to a list this fleet does not own (a branch's history, another prefix).
        msg = msg.model_copy(update={"reply_to": None})
        known = runtime.registry.get(msg.function) if msg.function in runtime.registry else None
        return await _finish_failed(store, msg, known, RefusedCallError(foreign), hostname)
    try:
        tool = runtime.registry.get(msg.function)
    except UnknownToolError as exc:
        stored = await store.terminal(msg.call_id)
        if stored is not None and stored.attempt >= msg.attempt:
            await store.notify(stored, msg.reply_to)
            return Outcome(stored, rebuild_error(stored))
        return await _finish_failed(store, msg, None, exc, hostname)
    try:
        check_call(msg, tool, pool=pool, max_argument_bytes=runtime.settings.max_argument_bytes)
    except ToolfleetError as exc:
        # Refused before the tool runs: a hand-made message the dispatcher would not send.
        return await _finish_failed(store, msg, tool, exc, hostname)

    # C7 in one round trip: a finished call's record, or the claim, or the live holder.
    marker = StartedMarker.now(hostname, msg.attempt)
    stored, holder = await store.begin(msg.call_id, marker)
    if stored is not None:
        await store.notify(stored, msg.reply_to)
        return Outcome(stored, rebuild_error(stored))
    while holder is not None:
        finished = await _wait_for_live_holder(store, msg, holder)
        if finished is not None:
            return Outcome(finished, rebuild_error(finished))
        if not (tool.idempotent or tool.read_only):
            lost = WorkerLostError(
                f"worker {holder.worker} was lost while running call {msg.call_id} of tool "
                f"{tool.function!r}; not re-run because the tool is not idempotent=True "
                f"nor read_only=True (mark it @tool(idempotent=True) if running it twice is "
                f"safe)"
            )
            if tool.max_concurrency is not None:
                # The lost run's slot: not re-run, so give it back now, not at its lapse.
                await forget_slot(limits_client(store), runtime.keys, tool, msg)
            return await _finish_failed(store, msg, tool, lost, hostname)
        # Another redelivery may take over first; then it is the live holder to wait for.
        holder = await store.take_over(msg.call_id, marker)

    runtime.heartbeat.add(msg.call_id, marker)
    try:
        if tool.limited:
            return await _run_limited(
                store, runtime, msg, tool, hostname, limit_s, cancel_is_final, pool
            )
        return await _run_tool(
            store, msg, tool, hostname, limit_s, cancel_is_final, settings=runtime.settings
        )
    finally:
        runtime.heartbeat.discard(msg.call_id)


async def _run_limited(
    store: CallStore,
    runtime: CallRuntime,
    msg: CallMessage,
    tool: Tool,
    hostname: str,
    limit_s: float | None,
    cancel_is_final: Callable[[], bool],
    pool: ToolKind | None,
) -> Outcome:
    """Run a call of a tool with a rate limit or concurrency cap: past both first (waiting
    at most the call's limit_wait_s, toolfleet.workers.limits), else FAILED RateLimitedError."""
    client = limits_client(store)
    try:
        held = await acquire_limits(
            client,
            runtime.keys,
            tool,
            msg,
            heartbeat=runtime.heartbeat,
            outage_limit_s=runtime.settings.outage_limit_s,
        )
    except RateLimitedError as exc:
        return await _finish_failed(store, msg, tool, exc, hostname)
    if held.waited:
        # Stopped while it waited (a deadline, a cancel: recorded by the dispatcher)? Then
        # it is not run at all.
        stored = await store.terminal(msg.call_id)
        if stored is not None and stored.attempt >= msg.attempt:
            await asyncio.shield(release_limits(client, held, runtime.heartbeat))
            return Outcome(stored, rebuild_error(stored))
    # On prefork the message's Celery time limit has room for the wait (send_options), so
    # the tool's own timeout_s is armed here, from its start (toolfleet.workers.alarm).
    alarm = per_call_alarm.set(True) if pool == "sync" else None
    try:
        return await _run_tool(
            store, msg, tool, hostname, limit_s, cancel_is_final, settings=runtime.settings
        )
    finally:
        if alarm is not None:
            per_call_alarm.reset(alarm)
        await asyncio.shield(release_limits(client, held, runtime.heartbeat))


async def _run_tool(
    store: CallStore,
    msg: CallMessage,
    tool: Tool,
    hostname: str,
    limit_s: float | None,
    cancel_is_final: Callable[[], bool],
    *,
    settings: Settings | None = None,
) -> Outcome:
    timeout_s = _effective_timeout(msg.timeout_s or tool.timeout_s, limit_s)
    try:
        arguments = tool_arguments(msg.arguments)  # resume values go to interrupt(), not the tool
        call = FunctionCalling(func_tool=tool, arguments=arguments, timeout_s=timeout_s)
    except Exception as exc:  # construction errors are raised by design; here they are data
        return await _finish_failed(store, msg, tool, exc, hostname)
    try:
        attributes = {tracing.ATTR_FUNCTION: tool.function}
        with tracing.span(f"toolfleet.tool {tool.function}", attributes) as tool_span:
            current = CurrentCall(msg, settings, tool_span)  # current_call() in the tool
            try:
                with bind_call(current), sync_tool_deadline(tool, timeout_s):
                    await call.invoke()
            except BaseException:
                current.close()
                raise
            # The tool's last progress report is pushed before its record (never after it).
            await current.settle()
            # What the tool raised (caught by invoke) makes its own span ERROR too.
            error = _tool_error(call, tool, timeout_s, limit_s, msg)
            if isinstance(error, BaseException):  # what the tool raised, not a stored record
                tracing.record_error(tool_span, error, message=not tool.secret_args)
    except BaseException:
        if not cancel_is_final():
            raise
    error = _tool_error(call, tool, timeout_s, limit_s, msg)
    event = {**call.to_dict(), "tool_call_id": msg.tool_call_id}
    _warn_if_unserializable(tool, call.execution.response, event)
    result = CallResult(
        call_id=msg.call_id,
        function=tool.function,
        event=event,
        attempt=msg.attempt,
        worker=hostname,
        batch_id=msg.batch_id,
    )
    with tracing.span("toolfleet.record", {tracing.ATTR_CALL_ID: msg.call_id}):
        written = await asyncio.shield(store.finish(result, msg.reply_to))
    if written is False:
        # Someone recorded this attempt first (a revoke): that record is the outcome.
        return await _stored_outcome(store, msg, result, ran=True)
    if call.status is EventStatus.FAILED:
        return Outcome(result, error if isinstance(error, BaseException) else rebuild_error(result))
    return Outcome(result, None)


def _warn_if_unserializable(tool: Tool, response: Any, event: dict[str, Any]) -> None:
    """A tool that returns a value with no JSON form still completes, its output the marker
    ``"<unserializable>"`` (ADR-0012 D1); say so in the worker's log, once per tool here."""
    if event["execution"]["response"] != UNSERIALIZABLE or response == UNSERIALIZABLE:
        return
    if tool.function in _warned_unserializable:
        return
    _warned_unserializable.add(tool.function)
    log.warning(
        "tool %r returned a %s, which has no JSON form: its calls complete with the output "
        "%r. Return JSON data (dict, list, str, int, float, bool, None; pydantic models, "
        "dataclasses, datetimes and UUIDs are converted). Said once per tool per worker process.",
        tool.function,
        type(response).__qualname__,
        UNSERIALIZABLE,
    )


def _tool_error(
    call: FunctionCalling,
    tool: Tool,
    timeout_s: float | None,
    limit_s: float | None,
    msg: CallMessage,
) -> BaseException | str | None:
    """The call's error, Celery's soft limit turned into the tool's timeout."""
    error = call.execution.error
    if isinstance(error, SoftTimeLimitExceeded):
        # Celery's soft limit (or a batch's per-call alarm) interrupted a sync tool: report
        # it as the tool's timeout.
        limit = timeout_s if timeout_s is not None else limit_s
        error = ToolTimeoutError(
            f"tool {tool.function!r} exceeded its time limit of "
            f"{_fmt_s(limit)} (Celery soft_time_limit); raise the tool's timeout_s if it "
            f"needs longer",
            timeout_s=limit,
        )
        call.execution.error = error
    pause = interrupted(error, msg.arguments.get(GRAPH_RESUME_KEY))
    if pause is not None:  # a LangGraph tool's interrupt(): where it stopped, as structure
        error = call.execution.error = pause
    return error


async def _wait_for_live_holder(
    store: CallStore, msg: CallMessage, holder: StartedMarker
) -> CallResult | None:
    """While another worker's heartbeat is fresh, wait for its terminal record.

    Returns the record, or None once the holder's heartbeat went stale (the worker is lost).
    """
    while True:
        stored = await store.terminal(msg.call_id)
        if stored is not None:
            return stored
        if holder.is_stale():
            return None
        await asyncio.sleep(_DUPLICATE_POLL_S)
        current = await store.started(msg.call_id)
        if current is None:
            # Marker gone but no record: whoever held it ended without finishing.
            stored = await store.terminal(msg.call_id)
            return stored
        holder = current


async def _finish_failed(
    store: CallStore,
    msg: CallMessage,
    tool: Tool | None,
    exc: BaseException,
    hostname: str,
    *,
    status: EventStatus = EventStatus.FAILED,
) -> Outcome:
    result = not_run_result(msg, tool, exc, status=status, worker=hostname)
    if await store.finish(result, msg.reply_to) is False:
        return await _stored_outcome(store, msg, result)
    return Outcome(result, exc if status is EventStatus.FAILED else None)


async def _stored_outcome(
    store: CallStore, msg: CallMessage, fallback: CallResult, *, ran: bool = False
) -> Outcome:
    stored = await store.terminal(msg.call_id) or fallback
    if ran and stored.worker is None:
        # The dispatcher stopped the call while it ran: keep what really happened beside it.
        await store.keep_late(fallback)
    return Outcome(stored, rebuild_error(stored))


def _parse(message: dict[str, Any] | CallMessage) -> CallMessage:
    if isinstance(message, CallMessage):
        return message
    try:
        return CallMessage.model_validate(message)
    except ValidationError as exc:
        raise MalformedRequestError(
            f"toolfleet.execute got a message that is not a CallMessage "
            f"({exc.error_count()} problems, first: {exc.errors()[0]['msg']}); publish calls "
            f"with toolfleet.dispatcher.send.enqueue.publish_calls"
        ) from None


def _effective_timeout(tool_s: float | None, limit_s: float | None) -> float | None:
    candidates = [s for s in (tool_s, limit_s) if s]
    return min(candidates) if candidates else None


def _fmt_s(value: float | None) -> str:
    return "?" if value is None else f"{value:g}s"


def _default_hostname() -> str:
    return f"{socket.gethostname()}.{os.getpid()}"
