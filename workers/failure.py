"""The record of a call that ended without its tool's own result: never ran, stopped, lost.

:func:`failed_event` builds the event of such a call (the tool never ran: unknown tool, refused,
worker lost, revoked, timed out outside the tool); :func:`record_if_absent` stores one for a
call that ended outside :func:`workers.task.execute_async` (a signal handler, the pool);
:func:`rebuild_error` turns a stored FAILED record back into an exception for Celery.
"""

from __future__ import annotations

import builtins
import uuid
from datetime import UTC, datetime
from typing import Any

import redis
from kombu.utils.url import maybe_sanitize_url
from pydantic import ValidationError

import schemas.errors as toolfleet_errors
from schemas.contract import safe_text
from schemas.errors import BrokerError
from schemas.execution import Execution
from schemas.function_calling import REDACTED, redact
from schemas.serialize import to_jsonable
from schemas.status import EventStatus
from schemas.tool import Tool
from schemas.wire import CallMessage, CallResult
from workers.guard import reply_to_problem
from workers.runtime import WorkerRuntime

__all__ = ["failed_event", "rebuild_error", "record_if_absent"]


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
