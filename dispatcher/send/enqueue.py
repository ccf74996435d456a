"""Enqueueing calls: the caller's half of the wire.

Celery message fields chosen here are what Flower and the worker logs show (C10): the task id
is the call_id, the task is shown as ``tool:<function>``, and its args are a redacted repr, so a
secret argument value never reaches Flower or a log line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError

from toolfleet.broker import tracing
from toolfleet.broker.outage import broker_unreachable
from toolfleet.dispatcher.send.bundles import publishing
from toolfleet.schemas.errors import BrokerError
from toolfleet.schemas.function_calling import redact
from toolfleet.schemas.limits import limit_wait_of
from toolfleet.schemas.settings import Settings, masked_url
from toolfleet.schemas.tasks import EXECUTE_TASK, task_id_for
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage
from toolfleet.workers.app import settings_of

__all__ = [
    "ARGSREPR_MAX_CHARS",
    "enqueue_error",
    "hard_limit_s",
    "is_outage",
    "publish_calls",
    "send_options",
    "task_id_for",
]

# Flower and the worker log show at most this much of a call's arguments.
ARGSREPR_MAX_CHARS = 1024


def enqueue_error(broker_url: str | None, count: int, exc: BaseException) -> BrokerError:
    """The error of a publish that failed, naming the broker with its password masked: this
    text becomes the error of every call it fails, in results and history."""
    return BrokerError(
        f"could not enqueue {count} call(s) on {masked_url(str(broker_url))!r}: "
        f"{type(exc).__name__}: {masked_url(str(exc))}; check that the broker is running"
    )


def hard_limit_s(soft_limit_s: float) -> float:
    """Celery's hard time limit for a soft limit: room for the call to record its timeout."""
    return soft_limit_s + max(5.0, soft_limit_s * 0.1)


def publish_calls(app: Celery, calls: Sequence[tuple[CallMessage, Tool]]) -> None:
    """Enqueue every call over one producer connection (blocking; run it in a thread).

    Raises BrokerError naming the broker (password masked) when it cannot be reached.
    """
    if not calls:
        return
    settings = settings_of(app)
    with publishing(app, "calls") as producer:
        for message, tool in calls:
            queue, options = send_options(settings, message, tool)
            app.send_task(
                EXECUTE_TASK,
                args=(message.model_dump(mode="json"),),
                task_id=task_id_for(message),
                queue=queue,
                producer=producer,
                **options,
            )


def send_options(
    settings: Settings, message: CallMessage, tool: Tool
) -> tuple[str, dict[str, Any]]:
    """A call's queue and the ``send_task`` options of its message (both publishing paths:
    kombu's here, :mod:`toolfleet.dispatcher.send.direct`)."""
    options: dict[str, Any] = {
        "shadow": f"tool:{tool.function}",
        "argsrepr": _argsrepr(message, tool),
        "kwargsrepr": "{}",
        "headers": tracing.trace_headers((message,)),
    }
    queue = settings.queue_for(tool.kind)
    limit_s = message.timeout_s or tool.timeout_s
    if tool.kind != "async" and limit_s:
        # The prefork pool interrupts a blocking tool with SoftTimeLimitExceeded. A call of a
        # tool with limits may first wait for them: the worker then arms timeout_s itself
        # when the tool starts (toolfleet.workers.limits).
        if tool.limited:
            limit_s += limit_wait_of(message.limit_wait_s)
        options["soft_time_limit"] = limit_s
        options["time_limit"] = hard_limit_s(limit_s)
    return queue, options


def is_outage(error: BaseException) -> bool:
    """Whether a BrokerError from enqueueing came from the broker being unreachable (worth
    retrying), not from a message it refused (encoding, size): connection errors, timeouts."""
    cause = error.__cause__
    if isinstance(cause, OperationalError):  # kombu's wrapper of a connection failure
        return True
    return cause is not None and broker_unreachable(cause)


def _argsrepr(message: CallMessage, tool: Tool) -> str:
    shown = {
        "call_id": message.call_id,
        "branch_id": message.branch_id,
        "function": message.function,
        # After "function", which Flower's tool-name pattern reads first.
        "tool_call_id": message.tool_call_id,
        "arguments": redact(message.arguments, tool.secret_args),
    }
    text = repr((shown,))
    if len(text) > ARGSREPR_MAX_CHARS:
        text = text[: ARGSREPR_MAX_CHARS - 3] + "..."
    return text
