"""toolfleet's asyncio execution pool: one event-loop thread per worker process.

Celery hands each message to :meth:`AsyncioPool.on_apply`; the pool runs the call's coroutine
(:func:`toolfleet.workers.call_runner.execute_async`) on its loop instead of Celery's blocking
tracer, so thousands of async tools can wait at once. The pool stores results (when a backend is
set) and fires Celery's callbacks itself, so acks_late, task events and Flower states work as with
prefork. Select it with ``worker_pool = "toolfleet.workers.aio_pool:AsyncioPool"`` or ``-P custom``
and ``CELERY_CUSTOM_WORKER_POOL=toolfleet.workers.aio_pool:AsyncioPool``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

from celery import Celery
from celery.concurrency.base import BasePool
from kombu.serialization import loads as loads_message
from kombu.serialization import prepare_accept_content

from toolfleet.schemas import tracing
from toolfleet.schemas.errors import InternalError
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tasks import EXECUTE_MANY_TASK
from toolfleet.workers.bundle import execute_many_async
from toolfleet.workers.call_runner import execute_async
from toolfleet.workers.cancel_listener import listen_for_cancels
from toolfleet.workers.celery_internals import PoolRequest, RevokedIds, pool_app_and_hostname
from toolfleet.workers.failure import record_if_absent
from toolfleet.workers.loop_watch import LoopWatch, code_of
from toolfleet.workers.pool_reporter import PoolReporter
from toolfleet.workers.runtime import WorkerRuntime, runtime_for

__all__ = ["AsyncioPool", "CallHandle"]

# Under "celery." so a worker started with --loglevel shows it like its own lines.
logger = logging.getLogger("celery.worker.aio_pool")

# How long the pool waits for its loop thread to come up before the worker fails to start.
_READY_TIMEOUT_S = 10.0
# On cold shutdown, how long cancelled calls get to clean up before the loop stops.
_CANCEL_GRACE_S = 5.0


class CallHandle:
    """What ``on_apply`` returns; Celery calls ``terminate()`` on revoke(terminate=True)."""

    def __init__(self, pool: AsyncioPool, task_id: str) -> None:
        self._pool = pool
        self.task_id = task_id
        self.future: concurrent.futures.Future[None] | None = None

    def terminate(self, signal: Any = None) -> None:
        self._pool.cancel_task(self.task_id)

    def ready(self) -> bool:
        return self.future is not None and self.future.done()


class AsyncioPool(BasePool):
    """A Celery pool whose concurrency is coroutines in flight on one loop thread."""

    signal_safe = False
    is_green = False
    task_join_will_block = False
    body_can_be_buffer = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        app, self.hostname = pool_app_and_hostname(self)
        self.app: Celery = app or self.app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._slots: asyncio.Semaphore | None = None
        # Every running call, by task id and by call id: the pool owns them all.
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._by_call: dict[str, str] = {}
        self._handles: dict[str, CallHandle] = {}
        self._user_cancelled: set[str] = set()
        self._shutting_down = False
        self._subscriber: asyncio.Task[None] | None = None
        self._reporter = PoolReporter(self.app)
        self._accept = prepare_accept_content(self.app.conf.accept_content)
        self._runtime: WorkerRuntime | None = None
        self._watch: LoopWatch | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def on_start(self) -> None:
        self._runtime = runtime_for(self.app)
        self._thread = threading.Thread(
            target=self._run_loop, name="toolfleet-asyncio-pool", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(_READY_TIMEOUT_S):
            raise InternalError(
                f"the asyncio pool's event loop did not start within {_READY_TIMEOUT_S:g}s"
            )
        if self._start_error is not None:
            raise InternalError(f"the asyncio pool failed to start: {self._start_error!r}")

    def _run_loop(self) -> None:
        try:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._slots = asyncio.Semaphore(self.limit or 1)
            assert self._runtime is not None
            self._subscriber = loop.create_task(
                listen_for_cancels(self._runtime, self._cancel_by_call_id)
            )
        except BaseException as exc:
            self._start_error = exc
            self._ready.set()
            raise
        loop.call_soon(self._ready.set)
        self._watch = LoopWatch(loop, threading.get_ident(), self._tool_codes)
        self._watch.start()
        try:
            loop.run_forever()
        finally:
            self._watch.stop()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _tool_codes(self) -> dict[CodeType, str]:
        assert self._runtime is not None
        codes = ((code_of(tool.func_callable), tool.function) for tool in self._runtime.registry)
        return {code: name for code, name in codes if code is not None}

    def on_stop(self) -> None:
        """Warm shutdown: let running calls finish, then stop the loop."""
        self._stop_loop(cancel=False)

    def on_terminate(self) -> None:
        """Cold shutdown: cancel running calls, wait for their cleanup, stop the loop."""
        self._stop_loop(cancel=True)

    def on_close(self) -> None:
        pass

    def restart(self) -> None:
        pass  # nothing to restart: the loop thread lives as long as the worker

    def terminate_job(self, pid: int, signal: Any = None) -> None:
        # Every call shares this process's pid; cancellation goes through CallHandle.terminate.
        pass

    def _stop_loop(self, *, cancel: bool) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or self._shutting_down:
            return
        self._shutting_down = True
        future = asyncio.run_coroutine_threadsafe(self._drain(cancel=cancel), loop)
        try:
            future.result()
        except (concurrent.futures.CancelledError, RuntimeError):
            pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(_CANCEL_GRACE_S)
        self._reporter.shutdown()

    async def _drain(self, *, cancel: bool) -> None:
        if self._subscriber is not None:
            self._subscriber.cancel()
        tasks = list(self._tasks.values())
        if cancel:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=_CANCEL_GRACE_S)
        elif tasks:
            await asyncio.wait(tasks)
        if self._runtime is not None:
            await self._runtime.async_store().aclose()

    # -- applying tasks -------------------------------------------------------------------------

    def on_apply(
        self,
        target: Any,
        args: Any = None,
        kwargs: Any = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        timeout_callback: Callable[..., Any] | None = None,
        error_callback: Callable[..., Any] | None = None,
        soft_timeout: float | None = None,
        timeout: float | None = None,
        correlation_id: str | None = None,
        **_: Any,
    ) -> CallHandle:
        loop = self._loop
        if loop is None:
            raise InternalError("the asyncio pool received a task before it started")
        request = PoolRequest(*args)
        task_id, request_dict, body = request.task_id, request.request, request.body
        content_type, content_encoding = request.content_type, request.content_encoding
        handle = CallHandle(self, task_id)
        # Celery keeps only a weak reference to the handle; the pool holds it until the call
        # ends, or revoke(terminate=True) would find nothing to terminate.
        self._handles[task_id] = handle
        handle.future = asyncio.run_coroutine_threadsafe(
            self._spawn(
                task_id,
                body,
                content_type,
                content_encoding,
                request_dict,
                callback=callback,
                accept_callback=accept_callback,
                error_callback=error_callback,
                limit_s=soft_timeout or timeout,
            ),
            loop,
        )
        return handle

    async def _spawn(self, task_id: str, *args: Any, **kwargs: Any) -> None:
        # A named asyncio.Task the pool holds, so cancel-by-id and shutdown can reach it.
        task = asyncio.current_task()
        assert task is not None
        self._tasks[task_id] = task
        try:
            await self._run(task_id, *args, **kwargs)
        finally:
            self._tasks.pop(task_id, None)
            self._handles.pop(task_id, None)
            self._user_cancelled.discard(task_id)

    async def _run(
        self,
        task_id: str,
        body: Any,
        content_type: str,
        content_encoding: str,
        request_dict: dict[str, Any],
        *,
        callback: Callable[..., Any] | None,
        accept_callback: Callable[..., Any] | None,
        error_callback: Callable[..., Any] | None,
        limit_s: float | None,
    ) -> None:
        assert self._slots is not None and self._runtime is not None
        runtime = self._runtime
        started = time.monotonic()
        hostname = self.hostname or request_dict.get("hostname")
        call_id: str | None = None
        message: Any = None
        try:
            args, _kwargs, _embed = loads_message(
                body, content_type, content_encoding, accept=self._accept
            )
            message = args[0]
            if request_dict.get("task") == EXECUTE_MANY_TASK:  # opt-in batching
                async with self._slots:
                    self._reporter.accepted(accept_callback)
                    summary = await execute_many_async(
                        message,
                        runtime=runtime,
                        hostname=hostname,
                        revoked=RevokedIds(),
                        pool="async",
                        trace=request_dict.get(tracing.TRACE_HEADER),
                    )
                self._reporter.succeeded(task_id, summary, callback, started)
                return
            # Known by call id before it waits for a slot, so a cancel reaches it there too.
            call_id = str(message.get("call_id")) if isinstance(message, dict) else None
            if call_id:
                self._by_call[call_id] = task_id
            async with self._slots:
                if task_id in RevokedIds():
                    # Revoked (without terminate) while it waited for a slot: never start it.
                    self._user_cancelled.add(task_id)
                    raise asyncio.CancelledError
                self._reporter.accepted(accept_callback)
                started = time.monotonic()
                outcome = await execute_async(
                    message,
                    runtime=runtime,
                    hostname=hostname,
                    limit_s=limit_s,
                    cancel_is_final=lambda: task_id in self._user_cancelled,
                    pool="async",
                    trace=request_dict.get(tracing.TRACE_HEADER),
                )
        except asyncio.CancelledError:
            if task_id not in self._user_cancelled:
                raise  # shutdown: unacked, so the broker redelivers it
            # Cancelled before execute_async recorded anything (e.g. waiting for a slot):
            # record CANCELLED unless it already has a record; FIFO before the revoke.
            cancelled = asyncio.CancelledError(f"call {call_id or task_id} was cancelled")
            self._reporter.submit(
                record_if_absent, runtime, message, cancelled, EventStatus.CANCELLED, hostname
            )
            self._reporter.cancelled(task_id, callback, started)
            return
        except Exception as exc:
            # Not a tool failure (those are data): an unusable message or a Redis error.
            # Try to leave a FAILED record so no collector waits for this call forever.
            logger.error("Task %s failed outside its tool: %r", task_id, exc)
            self._reporter.submit(
                record_if_absent, runtime, message, exc, EventStatus.FAILED, hostname
            )
            self._reporter.failed(task_id, exc, callback, started)
            return
        finally:
            if call_id:
                self._by_call.pop(call_id, None)
        self._reporter.outcome(task_id, outcome, callback, started)

    # -- cancellation ---------------------------------------------------------------------------

    def cancel_task(self, task_id: str) -> None:
        """Cancel one running call (thread-safe); its record ends CANCELLED."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(self._cancel_on_loop, task_id)

    def _cancel_on_loop(self, task_id: str) -> None:
        task = self._tasks.get(task_id)
        if task is not None and not task.done():
            self._user_cancelled.add(task_id)
            task.cancel()

    def _cancel_by_call_id(self, call_id: str) -> None:
        """C9: a call id arrived on the cancel channel; cancel its call if it runs here."""
        self._cancel_on_loop(self._by_call.get(call_id, call_id))

    def _get_info(self) -> dict[str, Any]:
        info = super()._get_info()
        info["running"] = len(self._tasks)
        return info

    @property
    def num_processes(self) -> int:
        return 1
