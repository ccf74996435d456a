"""The task ``toolfleet.execute``: one CallMessage in, one CallResult out, and a record in Redis.

All logic lives in :func:`execute_async`, shared by the prefork path (run on a per-process
event loop) and the asyncio pool (run directly on its loop thread).
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from celery import Celery, Task, signals
from celery.exceptions import Ignore, SoftTimeLimitExceeded, TimeLimitExceeded
from kombu.utils.url import maybe_sanitize_url
from pydantic import ValidationError

import schemas.errors as toolfleet_errors
from schemas import tracing
from schemas.contract import safe_text
from schemas.errors import (
    BrokerError,
    MalformedRequestError,
    RefusedCallError,
    ToolfleetError,
    ToolTimeoutError,
    UnknownToolError,
    WorkerLostError,
)
from schemas.execution import Execution
from schemas.function_calling import REDACTED, FunctionCalling, redact
from schemas.keys import Keys
from schemas.serialize import to_jsonable
from schemas.status import EventStatus
from schemas.tool import Tool, ToolKind
from schemas.wire import CallMessage, CallResult
from workers.app import EXECUTE_TASK, redis_url_of, registry_of, settings_of
from workers.guard import check_call, reply_to_problem
from workers.registry import Registry
from workers.store import AsyncRecordStore, Heartbeat, StartedMarker, SyncRecordStore

__all__ = [
    "Outcome",
    "WorkerRuntime",
    "current_call",
    "execute_async",
    "rebuild_error",
    "record_if_absent",
    "register_execute_task",
    "runtime_for",
]

# Per-call context. Celery's task.request is a thread-local stack: wrong for coroutines
# sharing one loop thread, so the message being run lives here.
current_call: contextvars.ContextVar[CallMessage | None] = contextvars.ContextVar(
    "toolfleet_current_call", default=None
)

# Poll period while a live duplicate delivery waits for the holder's terminal record.
_DUPLICATE_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class Outcome:
    """A call's terminal record plus the exception Celery must see when it FAILED."""

    result: CallResult
    error: BaseException | None = None

    @property
    def status(self) -> EventStatus:
        return self.result.status


class WorkerRuntime:
    """Per-process worker state for one app: registry, Redis stores, heartbeat thread."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.settings = settings_of(app)
        self.registry: Registry = registry_of(app)
        self.keys = Keys(self.settings.key_prefix)
        self.redis_url = redis_url_of(app)
        self.pid = os.getpid()
        self.sync_store = SyncRecordStore.from_url(
            self.redis_url, self.keys, record_ttl_s=self.settings.record_ttl_s
        )
        self.heartbeat = Heartbeat(self.sync_store)
        self._async_stores: dict[int, AsyncRecordStore] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def async_store(self) -> AsyncRecordStore:
        """The asyncio store bound to the running loop (a client cannot cross loops)."""
        loop = asyncio.get_running_loop()
        store = self._async_stores.get(id(loop))
        if store is None:
            store = AsyncRecordStore.from_url(
                self.redis_url,
                self.keys,
                record_ttl_s=self.settings.record_ttl_s,
                outage_limit_s=self.settings.outage_limit_s,
            )
            self._async_stores[id(loop)] = store
        return store

    def discard_loop(self) -> None:
        """Forget a loop left mid-task by an interrupt; the next call gets a fresh one."""
        self._loop = None
        self._async_stores.clear()

    def process_loop(self) -> asyncio.AbstractEventLoop:
        """The prefork child's event loop, reused across calls (not asyncio.run per call)."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop


_runtimes: dict[tuple[int, int], WorkerRuntime] = {}


def runtime_for(app: Celery) -> WorkerRuntime:
    """This process's runtime for ``app``; a forked child builds its own (no shared sockets)."""
    key = (id(app), os.getpid())
    runtime = _runtimes.get(key)
    if runtime is None:
        runtime = _runtimes[key] = WorkerRuntime(app)
    return runtime


async def execute_async(
    message: dict[str, Any] | CallMessage,
    *,
    runtime: WorkerRuntime,
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
    ``pool`` is the kind of pool running this (None skips the kind check, workers.guard).
    ``trace``: the message's ``schemas.tracing.TRACE_HEADER`` value, so the worker's span
    joins the dispatcher's trace.
    """
    msg = _parse(message)
    host = hostname or _default_hostname()
    with tracing.worker_span(msg, host, trace) as span:
        token = current_call.set(msg)
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
            current_call.reset(token)
        tracing.set_result_status(span, outcome.result)
        return outcome


async def _execute(
    msg: CallMessage,
    runtime: WorkerRuntime,
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
        if not tool.idempotent:
            lost = WorkerLostError(
                f"worker {holder.worker} was lost while running call {msg.call_id} of tool "
                f"{tool.function!r}; not re-run because the tool is not idempotent=True "
                f"(mark it @tool(idempotent=True) if running it twice is safe)"
            )
            return await _finish_failed(store, msg, tool, lost, hostname)
        # Another redelivery may take over first; then it is the live holder to wait for.
        holder = await store.take_over(msg.call_id, marker)

    runtime.heartbeat.add(msg.call_id, marker)
    try:
        return await _run_tool(store, msg, tool, hostname, limit_s, cancel_is_final)
    finally:
        runtime.heartbeat.discard(msg.call_id)


async def _run_tool(
    store: AsyncRecordStore,
    msg: CallMessage,
    tool: Tool,
    hostname: str,
    limit_s: float | None,
    cancel_is_final: Callable[[], bool],
) -> Outcome:
    timeout_s = _effective_timeout(msg.timeout_s or tool.timeout_s, limit_s)
    try:
        call = FunctionCalling(func_tool=tool, arguments=msg.arguments, timeout_s=timeout_s)
    except Exception as exc:  # construction errors are raised by design; here they are data
        return await _finish_failed(store, msg, tool, exc, hostname)
    try:
        attributes = {tracing.ATTR_FUNCTION: tool.function}
        with tracing.span(f"toolfleet.tool {tool.function}", attributes):
            await call.invoke()
    except BaseException:
        if not cancel_is_final():
            raise
    error = call.execution.error
    if isinstance(error, SoftTimeLimitExceeded):
        # Celery's soft limit interrupted a sync tool: report it as the tool's timeout.
        limit = timeout_s if timeout_s is not None else limit_s
        error = ToolTimeoutError(
            f"tool {tool.function!r} exceeded its time limit of "
            f"{_fmt_s(limit)} (Celery soft_time_limit); raise the tool's timeout_s if it "
            f"needs longer"
        )
        call.execution.error = error
    result = CallResult(
        call_id=msg.call_id,
        function=tool.function,
        event={**call.to_dict(), "tool_call_id": msg.tool_call_id},
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


async def _wait_for_live_holder(
    store: AsyncRecordStore, msg: CallMessage, holder: StartedMarker
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
    store: AsyncRecordStore,
    msg: CallMessage,
    tool: Tool | None,
    exc: BaseException,
    hostname: str,
    *,
    status: EventStatus = EventStatus.FAILED,
) -> Outcome:
    result = CallResult(
        call_id=msg.call_id,
        function=safe_text(msg.function),
        event=failed_event(msg, tool, exc, status=status),
        attempt=msg.attempt,
        worker=hostname,
        batch_id=msg.batch_id,
    )
    if await store.finish(result, msg.reply_to) is False:
        return await _stored_outcome(store, msg, result)
    return Outcome(result, exc if status is EventStatus.FAILED else None)


async def _stored_outcome(
    store: AsyncRecordStore, msg: CallMessage, fallback: CallResult, *, ran: bool = False
) -> Outcome:
    stored = await store.terminal(msg.call_id) or fallback
    if ran and stored.worker is None:
        # The dispatcher stopped the call while it ran: keep what really happened beside it.
        await store.keep_late(fallback)
    return Outcome(stored, rebuild_error(stored))


def failed_event(
    msg: CallMessage,
    tool: Tool | None,
    exc: BaseException,
    *,
    status: EventStatus = EventStatus.FAILED,
) -> dict[str, Any]:
    """An event record for a call whose tool never ran (unknown tool, worker lost, ...)."""
    execution = Execution(duration=0.0, status=status)
    execution.add_error(exc)
    if tool is not None:
        arguments = redact(msg.arguments, tool.secret_args)
    else:
        # No tool, no list of secret arguments: keep the names, hide every value.
        arguments = dict.fromkeys(msg.arguments, REDACTED)
    return {
        "id": str(uuid.uuid4()),
        "created_at": datetime.now(UTC).isoformat(),
        "execution": execution.to_dict(),
        "function": safe_text(msg.function),
        "arguments": to_jsonable(arguments),
        "tool_call_id": msg.tool_call_id,
    }


def rebuild_error(result: CallResult) -> BaseException | None:
    """An exception with the recorded type name and message, for Celery's FAILURE state."""
    if result.status is not EventStatus.FAILED:
        return None
    error = result.execution.get("error")
    if isinstance(error, dict):
        name = str(error.get("error") or "Exception")
        text = str(error.get("message") or "")
    else:
        name, text = "Exception", str(error)
    cls = getattr(toolfleet_errors, name, None) or getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(text)
        except Exception:  # e.g. ExceptionGroup needs two arguments
            pass
    return type(name, (Exception,), {"__module__": "toolfleet.remote"})(text)


def register_execute_task(app: Celery) -> Task:
    """Register ``toolfleet.execute`` on ``app`` (JSON dict in, JSON dict out)."""

    @app.task(name=EXECUTE_TASK, bind=True)
    def execute(self: Task, message: dict[str, Any]) -> dict[str, Any]:
        runtime = runtime_for(self.app)
        hard_s, soft_s = self.request.timelimit or (None, None)
        loop = runtime.process_loop()
        try:
            outcome = loop.run_until_complete(
                execute_async(
                    message,
                    runtime=runtime,
                    hostname=self.request.hostname,
                    limit_s=soft_s or hard_s,
                    pool="sync",
                    trace=getattr(self.request, tracing.TRACE_HEADER, None),
                )
            )
        except SoftTimeLimitExceeded:
            # The soft limit struck outside the tool (while the loop waited on Redis): the
            # loop may hold a half-run task, so drop it, and record the timeout here.
            runtime.discard_loop()
            exc = ToolTimeoutError(
                f"call of tool {message.get('function')!r} exceeded its time limit of "
                f"{_fmt_s(soft_s)} (Celery soft_time_limit)"
            )
            record_if_absent(runtime, message, exc, EventStatus.FAILED, self.request.hostname)
            raise exc from None
        except Exception as exc:
            # Not a tool failure (those are data): e.g. Redis failed mid-call. Leave a FAILED
            # record if Redis lets us, so no collector waits for this call forever.
            runtime.discard_loop()
            try:
                record_if_absent(runtime, message, exc, EventStatus.FAILED, self.request.hostname)
            except redis.RedisError:
                pass  # Redis is the problem; Celery's FAILURE state is all that is left
            raise
        return to_celery(self, outcome)

    task: Task = execute

    def is_ours(sender: Any) -> bool:
        # No sender filter at connect time: @app.task returns a proxy, not the task itself.
        return getattr(sender, "name", None) == EXECUTE_TASK and getattr(sender, "app", None) is app

    def record_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
        # A revoked call never reaches execute() (or its process was killed mid-call):
        # record it CANCELLED so its collector is not left waiting.
        if not is_ours(sender):
            return
        args = getattr(request, "args", None) or ()
        if args:
            exc = asyncio.CancelledError("the call was revoked")
            hostname = getattr(request, "hostname", None)
            record_if_absent(runtime_for(app), args[0], exc, EventStatus.CANCELLED, hostname)

    def record_hard_timeout(
        sender: Any = None, exception: Any = None, args: Any = None, **_: Any
    ) -> None:
        # Celery killed the process at the hard time limit: nothing in it wrote the record.
        if not is_ours(sender) or not isinstance(exception, TimeLimitExceeded) or not args:
            return
        function = args[0].get("function") if isinstance(args[0], dict) else None
        exc = ToolTimeoutError(
            f"tool {function!r} exceeded Celery's hard time_limit ({exception}) and its "
            f"process was killed; raise the tool's timeout_s if it needs longer"
        )
        record_if_absent(runtime_for(app), args[0], exc, EventStatus.FAILED, None)

    signals.task_revoked.connect(record_revoked, weak=False)
    signals.task_failure.connect(record_hard_timeout, weak=False)
    return task


def record_if_absent(
    runtime: WorkerRuntime,
    message: Any,
    exc: BaseException,
    status: EventStatus,
    hostname: str | None,
) -> None:
    """Record a call that ended outside execute_async, unless it already has a record."""
    if not isinstance(message, dict):
        return
    try:
        msg = CallMessage.model_validate(message)
    except ValidationError:
        return  # no call_id to record under
    reg = runtime.registry
    tool = reg.get(msg.function) if msg.function in reg else None
    if isinstance(exc, redis.RedisError | ConnectionError):
        # Issue 7: a broker failure is reported as one, naming the broker (password masked).
        # Issue 12: said only after Redis stayed unreachable past the outage limit, and
        # without claiming the tool ran: whether it did is not known here.
        exc = BrokerError(
            f"the broker {maybe_sanitize_url(runtime.redis_url)} failed while the worker "
            f"started or recorded call {msg.call_id} of tool {msg.function!r} "
            f"({type(exc).__name__}: {exc}) and was not back within "
            f"TOOLFLEET_OUTAGE_LIMIT_S={runtime.settings.outage_limit_s:g}s; whether the tool "
            f"ran is unknown. Check its effects before re-running the call"
        )
    result = CallResult(
        call_id=msg.call_id,
        function=safe_text(msg.function),
        event=failed_event(msg, tool, exc, status=status),
        attempt=msg.attempt,
        worker=hostname,
        batch_id=msg.batch_id,
    )
    if reply_to_problem(msg.reply_to, runtime.keys) is not None:
        msg = msg.model_copy(update={"reply_to": None})
    runtime.sync_store.finish_if_absent(result, msg.reply_to)


def to_celery(task: Task, outcome: Outcome) -> dict[str, Any]:
    """Mirror the event in Celery's state: return (SUCCESS), raise (FAILURE), revoke (REVOKED)."""
    status = outcome.status
    if status is EventStatus.FAILED:
        raise outcome.error or rebuild_error(outcome.result) or RuntimeError("call failed")
    if status is EventStatus.CANCELLED:
        task.send_event("task-revoked", terminated=True, signum=None, expired=False)
        task.backend.mark_as_revoked(task.request.id, "cancelled", request=task.request)
        raise Ignore()
    return outcome.result.model_dump(mode="json")


def _parse(message: dict[str, Any] | CallMessage) -> CallMessage:
    if isinstance(message, CallMessage):
        return message
    try:
        return CallMessage.model_validate(message)
    except ValidationError as exc:
        raise MalformedRequestError(
            f"toolfleet.execute got a message that is not a CallMessage "
            f"({exc.error_count()} problems, first: {exc.errors()[0]['msg']}); publish calls "
            f"with dispatcher.enqueue.publish_calls"
        ) from None


def _effective_timeout(tool_s: float | None, limit_s: float | None) -> float | None:
    candidates = [s for s in (tool_s, limit_s) if s]
    return min(candidates) if candidates else None


def _fmt_s(value: float | None) -> str:
    return "?" if value is None else f"{value:g}s"


def _default_hostname() -> str:
    return f"{socket.gethostname()}.{os.getpid()}"
