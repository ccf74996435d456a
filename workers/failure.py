"""Calls that end outside :func:`toolfleet.workers.call_runner.execute_async`, and FAILED records
for Celery.

:func:`record_if_absent` stores the record of a call a signal handler or the pool saw end
(revoked, killed at the hard time limit, a broker failure) unless it has one, built by the one
constructor for a call that never ran, was stopped or was lost
(:func:`toolfleet.schemas.record.not_run_result`); :func:`rebuild_error` turns a stored FAILED
record back into an exception for Celery.
"""

from __future__ import annotations

from typing import Any

import redis
from pydantic import ValidationError

from toolfleet.schemas.error_info import ErrorInfo
from toolfleet.schemas.error_info import rebuild_error as rebuild_remote_error
from toolfleet.schemas.errors import BrokerError, RemoteToolError
from toolfleet.schemas.record import not_run_result
from toolfleet.schemas.settings import masked_url
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallMessage, CallResult
from toolfleet.workers.guard import reply_to_problem
from toolfleet.workers.runtime import WorkerRuntime

__all__ = ["rebuild_error", "record_if_absent"]


def rebuild_error(result: CallResult) -> BaseException | None:
    """An exception of the recorded class (from the record's structure, ErrorInfo), for
    Celery's FAILURE state; None unless the call FAILED."""
    if result.status is not EventStatus.FAILED:
        return None
    info = ErrorInfo.from_record(result.execution.get("error")) or ErrorInfo(
        type="Exception", module="builtins", message=""
    )
    exc = rebuild_remote_error(info)
    if not isinstance(exc, RemoteToolError):
        return exc
    # A class this process cannot name (one local to a function): Celery and Flower show
    # the type's own name, as the tool raised it, not RemoteToolError.
    name = info.type.rpartition(".")[2] or "Exception"
    return type(name, (Exception,), {"__module__": "toolfleet.remote"})(info.message)


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
        # A broker failure is reported as one, naming the broker (password masked).
        # It is said only after Redis stayed unreachable past the outage limit, and
        # without claiming the tool ran: whether it did is not known here.
        exc = BrokerError(
            f"the broker {masked_url(runtime.redis_url)} failed while the worker "
            f"started or recorded call {msg.call_id} of tool {msg.function!r} "
            f"({type(exc).__name__}: {masked_url(str(exc))}) and was not back within "
            f"TOOLFLEET_OUTAGE_LIMIT_S={runtime.settings.outage_limit_s:g}s; whether the tool "
            f"ran is unknown. Check its effects before re-running the call"
        )
    result = not_run_result(msg, tool, exc, status=status, worker=hostname)
    if reply_to_problem(msg.reply_to, runtime.keys) is not None:
        msg = msg.model_copy(update={"reply_to": None})
    runtime.sync_store.finish_if_absent(result, msg.reply_to)
