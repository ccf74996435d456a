"""How the asyncio pool tells Celery a call's outcome: acks, task events, backend states.

Celery's callbacks block on I/O (the ack, the event publish, the backend write), so they run
off the pool's event loop, in order, on one thread: a record written before a report (e.g.
CANCELLED before the revoke) is in Redis before Celery announces it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from billiard.einfo import ExceptionInfo
from celery import Celery

from toolfleet.schemas.status import EventStatus
from toolfleet.workers.call_runner import Outcome
from toolfleet.workers.celery_internals import (
    cancelled_info,
    exception_info,
    report_failure,
    report_success,
    store_failure,
    store_success,
)

__all__ = ["PoolReporter"]

# Under "celery." so a worker started with --loglevel shows it like its own lines.
logger = logging.getLogger("celery.worker.aio_pool")

Callback = Callable[..., Any] | None


class PoolReporter:
    """Runs Celery's callbacks for the asyncio pool, in order, on one thread."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="toolfleet-callbacks"
        )

    def submit(self, func: Callable[..., Any], *args: Any) -> None:
        """Run ``func(*args)`` after every callback submitted before it."""
        self._executor.submit(_quiet(func), *args)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    def accepted(self, accept_callback: Callback) -> None:
        if accept_callback is not None:
            self.submit(accept_callback, os.getpid(), time.monotonic())

    def outcome(self, task_id: str, outcome: Outcome, callback: Callback, started: float) -> None:
        # Like Celery's tracer lines, without the result (its size and content are the
        # tool's); the record under Keys.event(call_id) has it.
        logger.info(
            "Task %s[%s] %s in %.3fs: %s",
            outcome.result.function and f"tool:{outcome.result.function}",
            task_id,
            "succeeded" if outcome.status is EventStatus.COMPLETED else "ended",
            time.monotonic() - started,
            outcome.status.value,
        )
        if outcome.status is EventStatus.FAILED:
            self.failed(task_id, outcome.error or RuntimeError("call failed"), callback, started)
        elif outcome.status is EventStatus.CANCELLED:
            self.cancelled(task_id, callback, started)
        else:
            self.succeeded(task_id, outcome.result.model_dump(mode="json"), callback, started)

    def succeeded(self, task_id: str, retval: Any, callback: Callback, started: float) -> None:
        self.submit(self._succeed, task_id, retval, time.monotonic() - started, callback)

    def failed(
        self, task_id: str, error: BaseException, callback: Callback, started: float
    ) -> None:
        einfo = exception_info(error)
        self.submit(self._fail, task_id, error, einfo, time.monotonic() - started, callback)

    def cancelled(self, task_id: str, callback: Callback, started: float) -> None:
        einfo = cancelled_info(task_id)
        if callback is not None:
            self.submit(report_failure, callback, einfo, time.monotonic() - started)

    def _succeed(self, task_id: str, retval: Any, runtime_s: float, callback: Callback) -> None:
        store_success(self.app, task_id, retval)
        report_success(callback, retval, runtime_s)

    def _fail(
        self,
        task_id: str,
        error: BaseException,
        einfo: ExceptionInfo,
        runtime_s: float,
        callback: Callback,
    ) -> None:
        store_failure(self.app, task_id, error, einfo)
        report_failure(callback, einfo, runtime_s)


def _quiet(func: Callable[..., Any]) -> Callable[..., None]:
    """Run a callback, logging (not losing) its exception: the executor would swallow it."""

    def run(*args: Any) -> None:
        try:
            func(*args)
        except Exception:
            logger.exception("toolfleet asyncio pool: callback %r failed", func)

    return run
