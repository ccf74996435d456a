"""Opt-in bundling for trivial tools: several calls per Celery message.

A Celery message costs a few milliseconds of broker and worker bookkeeping whatever the tool
does, which dwarfs an echo. ``toolfleet.execute_many`` carries a list of CallMessages; the
worker runs each through the same :func:`toolfleet.workers.call_runner.execute_async` as
``toolfleet.execute``, concurrently on one event loop, so every call keeps its own idempotency
check, started marker, terminal record and reply — the collector cannot tell a bundled call from a
single one.

Flower shows one task per *bundle* (named ``bundle:<function>:<n>``, args listing the call ids)
and, while a monitor watches, each call as its own ``tool:<function>`` task with the call_id
as task id (:mod:`toolfleet.workers.call_events`). What is lost per call: a bundled call can only be
revoked while queued, through Celery's revoked set (checked here before each call runs; only
the asyncio pool, which runs in the worker's main process, sees revokes that arrive after the
pool started). A
blocking sync tool's ``timeout_s`` is enforced per call by :mod:`toolfleet.workers.alarm` (no Celery
time limit covers one call of a bundle). So bundle only trivial, quick tools.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Container, Sequence
from typing import Any

from celery import Celery, Task

from toolfleet.schemas import tracing
from toolfleet.schemas.errors import MalformedRequestError
from toolfleet.schemas.record import not_run_result
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tasks import EXECUTE_MANY_TASK, task_id_for
from toolfleet.schemas.tool import ToolKind
from toolfleet.schemas.wire import CallMessage, CallResult
from toolfleet.workers.alarm import per_call_alarm
from toolfleet.workers.bundle_store import BundleRuntime, BundleStore
from toolfleet.workers.call_events import CallEvents, call_events
from toolfleet.workers.call_runner import execute_async
from toolfleet.workers.celery_internals import RevokedIds
from toolfleet.workers.runtime import WorkerRuntime, runtime_for

__all__ = ["EXECUTE_MANY_TASK", "execute_many_async", "register_execute_many_task"]

log = logging.getLogger(__name__)


async def execute_many_async(
    messages: Sequence[Any],
    *,
    runtime: WorkerRuntime,
    hostname: str | None = None,
    revoked: Container[str] = frozenset(),
    pool: ToolKind | None = None,
    trace: Any = None,
) -> dict[str, Any]:
    """Run every call of one bundle concurrently; each stores and signals its own record.

    Each call goes through :func:`toolfleet.workers.call_runner.execute_async` unchanged, but
    against a :class:`toolfleet.workers.bundle_store.BundleStore` that starts every call in one
    pipeline and writes every record and reply in another: two Redis round trips per bundle, not per
    call.

    A call whose task id is in ``revoked`` is recorded CANCELLED without running; an item
    that is not a CallMessage is counted ``malformed`` and skipped (it has no call_id to
    record under) without stopping its siblings. Returns a summary for Celery.
    """
    if not isinstance(messages, list | tuple):
        raise MalformedRequestError(
            f"{EXECUTE_MANY_TASK} takes a list of CallMessage dicts, got "
            f"{type(messages).__name__}; publish bundles with "
            "toolfleet.dispatcher.send.bundles.publish_bundles"
        )
    parsed: list[CallMessage] = []
    malformed = 0
    for raw in messages:
        try:
            parsed.append(_parse(raw))
        except MalformedRequestError as exc:
            log.error("%s: %s", EXECUTE_MANY_TASK, exc)
            malformed += 1
    store = BundleStore(runtime.async_store(), hostname or "")
    bundle_runtime = BundleRuntime(runtime, store)
    await store.prefetch(parsed, runtime.registry)

    async def one(msg: CallMessage, events: CallEvents | None) -> str:
        if events is not None:
            events.started(msg)
        if task_id_for(msg) in revoked:
            result = _revoked_result(msg, runtime, hostname)
            await store.finish(result, msg.reply_to)
            if events is not None:
                events.finished(msg, result, None)
            return EventStatus.CANCELLED.value
        outcome = await execute_async(
            msg, runtime=bundle_runtime, hostname=hostname, pool=pool, trace=trace
        )
        if events is not None:
            events.finished(msg, outcome.result, outcome.error)
        return str(outcome.status.value)

    # A blocking sync tool's timeout_s, per call: no Celery limit covers a bundle's calls.
    alarm = per_call_alarm.set(pool == "sync")
    try:
        # Each call its own Flower task while a monitor watches (toolfleet.workers.call_events).
        with call_events(runtime.app, hostname, runtime.registry) as events:
            statuses = await asyncio.gather(*(one(m, events) for m in parsed))
    finally:
        per_call_alarm.reset(alarm)
        # Records of the calls that finished are written even if a sibling raised.
        await store.flush()
    summary: dict[str, Any] = {"calls": len(messages)}
    if malformed:
        summary["malformed"] = malformed
    for status in statuses:
        summary[status] = summary.get(status, 0) + 1
    return summary


def _revoked_result(msg: CallMessage, runtime: WorkerRuntime, hostname: str | None) -> CallResult:
    error = asyncio.CancelledError(f"call {msg.call_id} was revoked before it ran")
    tool = runtime.registry.get(msg.function) if msg.function in runtime.registry else None
    return not_run_result(msg, tool, error, status=EventStatus.CANCELLED, worker=hostname)


def register_execute_many_task(app: Celery) -> Task:
    """Register ``toolfleet.execute_many`` on ``app``.

    The bundle task itself always succeeds: each call's outcome is in its own record, and one
    failed call must not mark its siblings FAILURE in Flower.
    """

    @app.task(name=EXECUTE_MANY_TASK, bind=True, shared=False)
    def execute_many(self: Task, messages: list[dict[str, Any]]) -> dict[str, Any]:
        runtime = runtime_for(self.app)
        summary: dict[str, Any] = runtime.process_loop().run_until_complete(
            execute_many_async(
                messages,
                runtime=runtime,
                hostname=self.request.hostname,
                revoked=RevokedIds(),
                pool="sync",
                trace=getattr(self.request, tracing.TRACE_HEADER, None),
            )
        )
        return summary

    task: Task = execute_many
    return task


def _parse(message: Any) -> CallMessage:
    if isinstance(message, CallMessage):
        return message
    try:
        return CallMessage.model_validate(message)
    except Exception:
        raise MalformedRequestError(
            f"{EXECUTE_MANY_TASK} got an item that is not a CallMessage dict: "
            f"{str(message)[:200]!r}; publish bundles with "
            "toolfleet.dispatcher.send.bundles.publish_bundles"
        ) from None
