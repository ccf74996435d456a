"""The Celery task ``toolfleet.execute`` on the prefork pool, and the records of calls that
end outside it (revoked before they ran, killed at Celery's hard time limit).

The call itself runs in :func:`toolfleet.workers.call_runner.execute_async` on the process's event
loop; this module mirrors its outcome in Celery's state (:func:`to_celery`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from celery import Celery, Task, signals
from celery.exceptions import Ignore, SoftTimeLimitExceeded, TimeLimitExceeded

from toolfleet.schemas import tracing
from toolfleet.schemas.errors import ToolTimeoutError
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tasks import EXECUTE_TASK
from toolfleet.workers.app_signals import connect as connect_signal
from toolfleet.workers.call_runner import Outcome, execute_async
from toolfleet.workers.celery_internals import mark_revoked, revoked_message
from toolfleet.workers.failure import rebuild_error, record_if_absent
from toolfleet.workers.runtime import runtime_for

__all__ = ["register_execute_task", "to_celery"]


def register_execute_task(app: Celery) -> Task:
    """Register ``toolfleet.execute`` on ``app`` (JSON dict in, JSON dict out)."""

    # shared=False: a shared task is also added to every app finalized later in the process.
    @app.task(name=EXECUTE_TASK, bind=True, shared=False)
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
                f"{_fmt_s(soft_s)} (Celery soft_time_limit)",
                timeout_s=soft_s,
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
        # app_signals hands over only this app's signals; toolfleet.execute_many is not ours.
        return getattr(sender, "name", None) == EXECUTE_TASK

    def record_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
        # A revoked call never reaches execute() (or its process was killed mid-call):
        # record it CANCELLED so its collector is not left waiting.
        if not is_ours(sender):
            return
        message, hostname = revoked_message(request)
        if message is not None:
            exc = asyncio.CancelledError("the call was revoked")
            record_if_absent(runtime_for(app), message, exc, EventStatus.CANCELLED, hostname)

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

    connect_signal(app, signals.task_revoked, record_revoked)
    connect_signal(app, signals.task_failure, record_hard_timeout)
    return task


def to_celery(task: Task, outcome: Outcome) -> dict[str, Any]:
    """Mirror the event in Celery's state: return (SUCCESS), raise (FAILURE), revoke (REVOKED)."""
    status = outcome.status
    if status is EventStatus.FAILED:
        raise outcome.error or rebuild_error(outcome.result) or RuntimeError("call failed")
    if status is EventStatus.CANCELLED:
        mark_revoked(task)
        raise Ignore()
    return outcome.result.model_dump(mode="json")


def _fmt_s(value: float | None) -> str:
    return "?" if value is None else f"{value:g}s"
