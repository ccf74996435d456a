"""Stopping calls a batch no longer waits for: the caller cancelled act() (C9), or a limit passed.

Each such call gets a terminal record under ``Keys.event(call_id)`` *before* it is revoked, so
a worker that receives its message later (one that missed the revoke broadcast, or a
redelivery) finds a terminal record and does not run the tool (C7). If a worker recorded a
real outcome first, that record wins and is returned instead. Queued calls are revoked;
running async calls are cancelled through the workers' cancel channel. Running sync calls are
left to finish: killing a prefork child mid-call could leave a half-done side effect. Their
record says so (``stopped_while_running``), and the worker keeps its own record of the run
beside it (``Keys.late``), which :func:`toolfleet.dispatcher.history.history.load_records` attaches
to the event as ``late_result``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Sequence

import redis
from celery import Celery
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from toolfleet.broker.liveness import StartedMarker
from toolfleet.broker.redis_url import replica_acks_of, sync_client, wait_for_replicas
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.record import not_run_result
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tasks import task_id_for
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage, CallResult
from toolfleet.workers.app import redis_url_of, settings_of

__all__ = [
    "SETTLE_TIMEOUT_S",
    "StragglerBuffer",
    "cancel_running",
    "cancelled_error",
    "revoke_calls",
    "settle_calls",
    "stopped_result",
]

log = logging.getLogger(__name__)

# Bounds the Redis writes and the revoke broadcast: settling must not hang the caller when
# the broker is the thing that failed.
SETTLE_TIMEOUT_S = 5.0


def cancelled_error(message: CallMessage) -> asyncio.CancelledError:
    return asyncio.CancelledError(
        f"call {message.call_id} of tool {message.function!r} was cancelled: the task "
        f"awaiting act() was cancelled"
    )


def stopped_result(
    message: CallMessage, tool: Tool | None, error: BaseException, status: EventStatus
) -> CallResult:
    """A terminal record for a call stopped by the dispatcher (it never ran, or was stopped)."""
    return not_run_result(message, tool, error, status=status, worker=None)


# A call to stop: its message, its tool, the error it ends with, and the future of its record.
_Straggler = tuple[CallMessage, Tool | None, BaseException, "asyncio.Future[CallResult]"]


class StragglerBuffer:
    """Coalesces the stragglers of one loop tick into one :func:`settle_calls` round trip."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._buffer: list[_Straggler] = []
        self._flusher: asyncio.Task[None] | None = None

    async def settle(
        self, message: CallMessage, tool: Tool | None, error: BaseException
    ) -> CallResult:
        """Stop one call with a FAILED ``error``; the record that stands for it."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[CallResult] = loop.create_future()
        self._buffer.append((message, tool, error, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        return await asyncio.shield(done)

    async def _flush(self) -> None:
        chunk: list[_Straggler] = []
        try:
            await asyncio.sleep(0)  # every straggler of this tick joins the round trip
            while self._buffer:
                chunk, self._buffer = self._buffer, []
                errors = {m.call_id: e for m, _, e, _ in chunk}
                records = await settle_calls(
                    self._fleet,
                    [(m, t) for m, t, _, _ in chunk],
                    lambda m, errors=errors: errors[m.call_id],  # type: ignore[misc]
                    EventStatus.FAILED,
                )
                for message, _, _, done in chunk:
                    if not done.done():
                        done.set_result(records[message.call_id])
        except asyncio.CancelledError:
            self._end_waits(chunk, None)
            raise
        except Exception as exc:
            self._end_waits(chunk, exc)  # the waiters raise it; nobody awaits this task

    def _end_waits(self, chunk: list[_Straggler], error: Exception | None) -> None:
        """Each waiter awaits its future and nothing else: a flush that ends any other way
        than settling (an unexpected error; cancelled, when ``error`` is None) ends them too."""
        pending, self._buffer = [*chunk, *self._buffer], []
        for _, _, _, done in pending:
            if done.done():
                continue
            if error is None:
                done.cancel()
            else:
                done.set_exception(error)


async def settle_calls(
    fleet: Fleet,
    calls: Sequence[tuple[CallMessage, Tool | None]],
    error_for: Callable[[CallMessage], BaseException],
    status: EventStatus,
) -> dict[str, CallResult]:
    """Record each call terminal with ``status`` and ``error_for(message)`` unless a worker
    already recorded it; revoke the queued ones and cancel the running async ones.

    Returns the record that stands for each call_id. Never raises for a broker failure: the
    records are still returned (and the failure logged).
    """
    if not calls:
        return {}
    try:
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            running = await _running_sync(fleet, calls)
    except (RedisError, OSError, TimeoutError) as exc:
        log.warning("could not tell which stopped sync calls were running: %r", exc)
        running = {}
    results: dict[str, CallResult] = {}
    for message, tool in calls:
        worker = running.get(message.call_id)
        error = error_for(message)
        if worker is not None:
            error = _still_running(error, worker)
        results[message.call_id] = stopped_result(message, tool, error, status)
        if worker is not None:
            results[message.call_id].event["stopped_while_running"] = worker
    try:
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            stored = await _store_retrying(fleet, results)
        results.update(stored)
    except (RedisError, OSError, TimeoutError) as exc:
        log.warning("could not record %d stopped call(s): %r", len(results), exc)
    await _revoke(fleet, calls)
    return results


async def _running_sync(
    fleet: Fleet, calls: Sequence[tuple[CallMessage, Tool | None]]
) -> dict[str, str]:
    """call_id -> worker, for each sync call of ``calls`` that a worker is running now."""
    sync_ids = [m.call_id for m, tool in calls if tool is None or tool.kind != "async"]
    if not sync_ids:
        return {}
    raws = await fleet.redis.mget([fleet.keys.started(call_id) for call_id in sync_ids])
    return {
        call_id: StartedMarker.from_json(raw).worker
        for call_id, raw in zip(sync_ids, raws, strict=True)
        if raw is not None
    }


def _still_running(error: BaseException, worker: str) -> BaseException:
    """``error`` saying the truth about a sync call it cannot stop."""
    text = (
        f"{error} — it was already running on worker {worker}, where a sync call cannot be "
        f"stopped: it runs on, and its own outcome (whether it completed) is attached to "
        f"this event as late_result once the worker records it (Branch.load, toolfleet "
        f"history)"
    )
    try:
        return type(error)(text)
    except Exception:  # an exception type whose constructor takes other arguments
        return RuntimeError(f"{type(error).__name__}: {text}")


async def _store_retrying(fleet: Fleet, results: dict[str, CallResult]) -> dict[str, CallResult]:
    try:
        return await _store(fleet, results)
    except RedisConnectionError:
        # After a broker restart a pooled connection is stale and redis-py does not retry a
        # pipeline; the failed connection is dropped, so one more try reconnects.
        return await _store(fleet, results)


async def _store(fleet: Fleet, results: dict[str, CallResult]) -> dict[str, CallResult]:
    """SET NX every record; where one exists already, keep a newer-or-equal attempt's."""
    client = fleet.redis
    ttl_s = fleet.settings.record_ttl_s
    ids = list(results)
    async with client.pipeline(transaction=False) as pipe:
        for call_id in ids:
            pipe.set(
                fleet.keys.event(call_id), results[call_id].model_dump_json(), nx=True, ex=ttl_s
            )
        created = await pipe.execute()
    standing: dict[str, CallResult] = {}
    ours_stand = [call_id for call_id, was_set in zip(ids, created, strict=True) if was_set]
    for call_id, was_set in zip(ids, created, strict=True):
        if was_set:
            continue
        raw = await client.get(fleet.keys.event(call_id))
        ours = results[call_id]
        existing = None if raw is None else CallResult.model_validate_json(raw)
        if existing is not None and existing.attempt >= ours.attempt:
            standing[call_id] = existing  # the worker finished first: its outcome stands
        else:
            await client.set(fleet.keys.event(call_id), ours.model_dump_json(), ex=ttl_s)
            ours_stand.append(call_id)
    if ours_stand:
        # A stopped call is terminal: its started marker would otherwise outlive it (a worker
        # still running it cannot store its record, so never drops the marker) and count as
        # in flight. Redeliveries look at the terminal record first, so nothing needs it.
        await client.delete(*(fleet.keys.started(call_id) for call_id in ours_stand))
        await wait_for_replicas(client, replica_acks_of(client))  # TOOLFLEET_REPLICA_ACKS
    return standing


async def _revoke(fleet: Fleet, calls: Sequence[tuple[CallMessage, Tool | None]]) -> None:
    task_ids = [task_id_for(message) for message, _ in calls]
    running_async = [m.call_id for m, tool in calls if tool is not None and tool.kind == "async"]

    def broadcast() -> None:
        revoke_calls(fleet.app, task_ids)
        cancel_running(fleet.app, running_async)

    try:
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            await _in_daemon_thread(broadcast)
    except Exception as exc:  # the broker may be down; the stored records still stop reruns
        log.warning("could not revoke %d call(s): %r", len(task_ids), exc)


async def _in_daemon_thread(function: Callable[[], None]) -> None:
    """``function()`` in a daemon thread of its own. kombu retries a broadcast for as long as
    the broker stays down; in the loop's default executor that thread would hold up the end of
    ``asyncio.run`` (which joins the executor) until the broker came back."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return  # given up on (the caller's timeout)
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            function()
        except BaseException as exc:
            error = exc
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:
            pass  # the loop has ended: nobody waits any more

    threading.Thread(target=run, name="toolfleet-revoke", daemon=True).start()
    await done


def revoke_calls(app: Celery, task_ids: Iterable[str]) -> None:
    """Revoke queued calls (ids as :func:`task_id_for` made them); a worker skips them.

    The worker that drops a revoked call records it CANCELLED (see toolfleet.workers.prefork_task).
    """
    ids = list(task_ids)
    if ids:
        app.control.revoke(ids)


def cancel_running(
    app_or_redis: Celery | redis.Redis, call_ids: Iterable[str], *, keys: Keys | None = None
) -> int:
    """Ask every async worker to cancel these calls if running; returns listeners reached.

    A cancelled call's record ends CANCELLED and its Celery state REVOKED. With a Redis
    client, pass ``keys`` unless the fleet uses the default key prefix.
    """
    ids = list(call_ids)
    if not ids:
        return 0
    if isinstance(app_or_redis, Celery):
        keys = keys or Keys(settings_of(app_or_redis).key_prefix)
        client = sync_client(redis_url_of(app_or_redis))
        owned = True
    else:
        keys = keys or Keys()
        client = app_or_redis
        owned = False
    try:
        reached = 0
        for call_id in ids:
            reached = max(reached, int(client.publish(keys.cancel_channel(), call_id)))
        return reached
    finally:
        if owned:
            client.close()
