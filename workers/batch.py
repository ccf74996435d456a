"""Opt-in batching for trivial tools: several calls per Celery message (issue 8 item 3).

A Celery message costs a few milliseconds of broker and worker bookkeeping whatever the tool
does, which dwarfs an echo. ``toolfleet.execute_many`` carries a list of CallMessages; the
worker runs each through the same :func:`workers.task.execute_async` as ``toolfleet.execute``,
concurrently on one event loop, so every call keeps its own idempotency check, started marker,
terminal record and reply — the collector cannot tell a batched call from a single one.

What is lost per call: Flower shows one task per *batch* (named ``batch:<function>:<n>``,
args listing the call ids), not one per call; a batched call can only be revoked while queued,
through Celery's revoked set (checked here before each call runs; only the asyncio pool, which
runs in the worker's main process, sees revokes that arrive after the pool started); and no
Celery time limit guards a blocking sync tool inside a batch (a tool's ``timeout_s`` still
bounds async tools). So batch only trivial, quick tools.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Container, Sequence
from typing import Any, cast

import redis
from celery import Celery, Task
from kombu.exceptions import KombuError, OperationalError
from kombu.utils.url import maybe_sanitize_url

from schemas import tracing
from schemas.errors import BrokerError, ConfigurationError, MalformedRequestError
from schemas.status import EventStatus
from schemas.tool import Tool, ToolKind
from schemas.wire import CallMessage, CallResult
from workers.app import settings_of

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "EXECUTE_MANY_TASK",
    "execute_many_async",
    "publish_batched",
    "register_execute_many_task",
]

log = logging.getLogger(__name__)

EXECUTE_MANY_TASK = "toolfleet.execute_many"
# Large enough to amortize one Celery message over many echoes, small enough that a batch
# of a slow tool does not hold a whole worker for long, and that a lost worker re-runs little.
DEFAULT_BATCH_SIZE = 100
# Redis connections one batch may hold at once for calls off the prefetched happy path.
_SLOW_PATH_CONNECTIONS = 8
# Flower shows at most this many call ids in a batch task's args.
_ARGSREPR_MAX_IDS = 20


def batch_task_id() -> str:
    return f"batch-{uuid.uuid4()}"


def publish_batched(
    app: Celery, calls: Sequence[tuple[CallMessage, Tool]], batch_size: int = DEFAULT_BATCH_SIZE
) -> list[str]:
    """Enqueue ``calls`` as ``toolfleet.execute_many`` messages of up to ``batch_size`` calls.

    Calls are grouped by queue (sync / async) in input order. Returns the batch task ids.
    Raises BrokerError naming the broker when it cannot be reached.
    """
    if batch_size < 1:
        raise ConfigurationError(
            f"batch_size must be at least 1, got {batch_size!r}; use 1 to send one call per "
            f"message or leave it at {DEFAULT_BATCH_SIZE}"
        )
    settings = settings_of(app)
    by_queue: dict[str, list[tuple[CallMessage, Tool]]] = {}
    for message, tool in calls:
        queue = settings.async_queue if tool.kind == "async" else settings.sync_queue
        by_queue.setdefault(queue, []).append((message, tool))
    task_ids = []
    try:
        with app.producer_or_acquire() as producer:
            for queue, queued in by_queue.items():
                for start in range(0, len(queued), batch_size):
                    chunk = queued[start : start + batch_size]
                    task_id = batch_task_id()
                    app.send_task(
                        EXECUTE_MANY_TASK,
                        args=([m.model_dump(mode="json") for m, _ in chunk],),
                        task_id=task_id,
                        queue=queue,
                        shadow=_shadow(chunk),
                        argsrepr=_argsrepr(chunk),
                        kwargsrepr="{}",
                        producer=producer,
                        headers=tracing.trace_headers(m for m, _ in chunk),
                    )
                    task_ids.append(task_id)
    except (OperationalError, KombuError, redis.RedisError, OSError) as exc:
        url = maybe_sanitize_url(str(app.conf.broker_url))
        raise BrokerError(
            f"cannot enqueue batched calls on broker {url}: {exc}; check that Redis is "
            f"running and TOOLFLEET_BROKER_URL points at it"
        ) from exc
    return task_ids


async def execute_many_async(
    messages: Sequence[Any],
    *,
    runtime: Any,
    hostname: str | None = None,
    revoked: Container[str] = frozenset(),
    pool: ToolKind | None = None,
    trace: Any = None,
) -> dict[str, Any]:
    """Run every call of one batch concurrently; each stores and signals its own record.

    ``runtime`` is the worker's :class:`workers.task.WorkerRuntime`. Each call goes through
    :func:`workers.task.execute_async` unchanged, but against a :class:`_BatchStore` that
    answers the idempotency checks from one MGET, claims every call in one pipeline and writes
    every record and reply in one transaction: three Redis round trips per batch, not per call.

    A call whose task id is in ``revoked`` is recorded CANCELLED without running; an item
    that is not a CallMessage is counted ``malformed`` and skipped (it has no call_id to
    record under) without stopping its siblings. Returns a summary for Celery.
    """
    from workers.task import execute_async

    if not isinstance(messages, list | tuple):
        raise MalformedRequestError(
            f"{EXECUTE_MANY_TASK} takes a list of CallMessage dicts, got "
            f"{type(messages).__name__}; publish batches with workers.batch.publish_batched"
        )
    parsed: list[CallMessage] = []
    malformed = 0
    for raw in messages:
        try:
            parsed.append(_parse(raw))
        except MalformedRequestError as exc:
            log.error("%s: %s", EXECUTE_MANY_TASK, exc)
            malformed += 1
    store = _BatchStore(runtime.async_store(), hostname or "")
    batch_runtime = _BatchRuntime(runtime, store)
    await store.prefetch(parsed, runtime.registry)

    async def one(msg: CallMessage) -> str:
        if _task_id(msg) in revoked:
            await store.finish(_revoked_result(msg, runtime, hostname), msg.reply_to)
            return EventStatus.CANCELLED.value
        # Duck-typed: execute_async uses only registry, heartbeat and async_store().
        outcome = await execute_async(
            msg, runtime=cast(Any, batch_runtime), hostname=hostname, pool=pool, trace=trace
        )
        return str(outcome.status.value)

    try:
        statuses = await asyncio.gather(*(one(m) for m in parsed))
    finally:
        # Records of the calls that finished are written even if a sibling raised.
        await store.flush()
    summary: dict[str, Any] = {"calls": len(messages)}
    if malformed:
        summary["malformed"] = malformed
    for status in statuses:
        summary[status] = summary.get(status, 0) + 1
    return summary


class _BatchRuntime:
    """The worker runtime as execute_async sees it, with the batch's store swapped in."""

    def __init__(self, runtime: Any, store: _BatchStore) -> None:
        self.registry = runtime.registry
        self.heartbeat = runtime.heartbeat
        self.keys = runtime.keys
        self.settings = runtime.settings
        self._store = store

    def async_store(self) -> _BatchStore:
        return self._store


class _BatchStore:
    """An AsyncRecordStore whose per-call reads come from one prefetch and whose writes are
    buffered until :meth:`flush`.

    The prefetch answers, per call and in order, the reads execute_async makes on its happy
    path: the first look for a terminal record, the claim, and the look again after the claim
    (taken in the same pipeline, right after the claim, so it sees what a racing duplicate
    wrote). Anything else (a live duplicate, a lost holder, a release) goes to the real store,
    so execute_async's C7 and worker-lost rules hold unchanged.
    """

    def __init__(self, store: Any, hostname: str) -> None:
        self.store = store
        self.hostname = hostname
        self._terminal: dict[str, list[bytes | None]] = {}
        self._claimed: set[str] = set()
        self._writes: list[tuple[CallResult, str | None, bool]] = []
        # The client's pool has a connection cap (redis-py: 100) shared by every batch on the
        # loop; a batch whose calls all take the slow path must not open one per call.
        self._slow_path = asyncio.Semaphore(_SLOW_PATH_CONNECTIONS)

    def __getattr__(self, name: str) -> Any:
        # Every other store operation (release, started, take_over, ...) is the real one.
        operation = getattr(self.store, name)
        if not callable(operation):
            return operation

        async def bounded(*args: Any, **kwargs: Any) -> Any:
            async with self._slow_path:
                return await operation(*args, **kwargs)

        return bounded

    async def prefetch(self, messages: Sequence[CallMessage], registry: Any) -> None:
        if not messages:
            return
        from workers.store import StartedMarker

        keys, client = self.store.keys, self.store.client
        raws = await client.mget([keys.event(m.call_id) for m in messages])
        self._terminal = {m.call_id: [raw] for m, raw in zip(messages, raws, strict=True)}
        # Claim exactly the calls execute_async would claim: not terminal, tool registered.
        to_claim = [
            m
            for m, raw in zip(messages, raws, strict=True)
            if raw is None and m.function in registry
        ]
        if not to_claim:
            return
        async with client.pipeline(transaction=False) as pipe:
            for m in to_claim:
                marker = StartedMarker.now(self.hostname, m.attempt)
                pipe.set(
                    keys.started(m.call_id), marker.to_json(), nx=True, ex=self.store.record_ttl_s
                )
                pipe.get(keys.event(m.call_id))
            replies = await pipe.execute()
        for i, m in enumerate(to_claim):
            claimed, recheck = replies[2 * i], replies[2 * i + 1]
            if claimed:
                self._claimed.add(m.call_id)
                self._terminal[m.call_id].append(recheck)

    async def terminal(self, call_id: str) -> CallResult | None:
        answers = self._terminal.get(call_id)
        if answers:
            raw = answers.pop(0)
            return None if raw is None else CallResult.model_validate_json(raw)
        async with self._slow_path:
            result: CallResult | None = await self.store.terminal(call_id)
        return result

    async def begin(self, call_id: str, marker: Any) -> tuple[CallResult | None, Any]:
        """AsyncRecordStore.begin() from the answers prefetch() gathered for the whole batch."""
        stored = await self.terminal(call_id)
        if stored is not None and stored.attempt >= marker.attempt:
            return stored, None
        holder = await self.claim(call_id, marker)
        if holder is None:
            # A duplicate may have finished between the batch's look and its claim.
            stored = await self.terminal(call_id)
            if stored is not None and stored.attempt >= marker.attempt:
                async with self._slow_path:
                    await self.store.release(call_id, marker)
                return stored, None
        return None, holder

    async def claim(self, call_id: str, marker: Any) -> Any:
        if call_id in self._claimed:
            self._claimed.discard(call_id)
            return None
        async with self._slow_path:
            return await self.store.claim(call_id, marker)

    async def finish(self, result: CallResult, reply_to: str | None) -> bool:
        # Applied at flush() with the same first-record-wins script as the real finish(); a
        # record that loses there (a revoke got in first) keeps the stored one in Redis and
        # the reply list, and only this batch's summary count is optimistic.
        self._writes.append((result, reply_to, True))
        return True

    async def notify(self, result: CallResult, reply_to: str | None) -> None:
        self._writes.append((result, reply_to, False))

    async def flush(self) -> None:
        """Write every buffered record and reply in one round trip, each as finish() would."""
        from workers.store import _FINISH_SCRIPT

        writes, self._writes = self._writes, []
        if not writes:
            return
        keys, ttl_s, client = self.store.keys, self.store.record_ttl_s, self.store.client
        script = client.register_script(_FINISH_SCRIPT)
        async with client.pipeline(transaction=False) as pipe:
            for result, reply_to, store_record in writes:
                payload = result.model_dump_json()
                if store_record:
                    call_id = result.call_id
                    await script(
                        keys=[keys.event(call_id), keys.started(call_id), reply_to or ""],
                        args=[payload, result.attempt, ttl_s],
                        client=pipe,
                    )
                elif reply_to:
                    pipe.rpush(reply_to, payload)
                    pipe.expire(reply_to, ttl_s)
            await asyncio.shield(pipe.execute())


def _task_id(msg: CallMessage) -> str:
    from dispatcher.enqueue import task_id_for

    return task_id_for(msg)


def _revoked_result(msg: CallMessage, runtime: Any, hostname: str | None) -> CallResult:
    from workers.task import failed_event

    error = asyncio.CancelledError(f"call {msg.call_id} was revoked before it ran")
    tool = runtime.registry.get(msg.function) if msg.function in runtime.registry else None
    return CallResult(
        call_id=msg.call_id,
        function=msg.function,
        event=failed_event(msg, tool, error, status=EventStatus.CANCELLED),
        attempt=msg.attempt,
        worker=hostname,
        batch_id=msg.batch_id,
    )


def register_execute_many_task(app: Celery) -> Task:
    """Register ``toolfleet.execute_many`` on ``app``.

    The batch task itself always succeeds: each call's outcome is in its own record, and one
    failed call must not mark its siblings FAILURE in Flower.
    """

    @app.task(name=EXECUTE_MANY_TASK, bind=True, shared=False)
    def execute_many(self: Task, messages: list[dict[str, Any]]) -> dict[str, Any]:
        from celery.worker import state

        from workers.task import runtime_for

        runtime = runtime_for(self.app)
        summary: dict[str, Any] = runtime.process_loop().run_until_complete(
            execute_many_async(
                messages,
                runtime=runtime,
                hostname=self.request.hostname,
                revoked=state.revoked,
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
            f"{str(message)[:200]!r}; publish batches with workers.batch.publish_batched"
        ) from None


def _shadow(chunk: Sequence[tuple[CallMessage, Tool]]) -> str:
    functions = sorted({tool.function for _, tool in chunk})
    name = functions[0] if len(functions) == 1 else "+".join(functions[:3])
    return f"batch:{name}:{len(chunk)}"


def _argsrepr(chunk: Sequence[tuple[CallMessage, Tool]]) -> str:
    # Call ids only: arguments (and any secret among them) never reach Flower from here.
    ids = [m.call_id for m, _ in chunk[:_ARGSREPR_MAX_IDS]]
    more = len(chunk) - len(ids)
    return repr(ids) + (f" +{more} more" if more else "")
