"""A sync tool's ``timeout_s`` inside a bundle message: a per-call interval timer.

A single ``toolfleet.execute`` message carries Celery's soft time limit, which interrupts a
blocking sync tool. A ``toolfleet.execute_many`` message holds many calls and no Celery limit
can stand for each of them, so the prefork child arms ``ITIMER_REAL`` around each blocking
call itself: on expiry SIGALRM raises Celery's ``SoftTimeLimitExceeded`` in the tool, exactly
what the soft limit raises, and the call is recorded FAILED ToolTimeoutError like a single one.

Only where it is sound: the bundle turned it on (:data:`per_call_alarm`), this is the main
thread (signals are delivered there), and the tool blocks from start to end (a sync callable
with no async pre/postprocessor, so no other call of the bundle runs while the timer is armed).
"""

from __future__ import annotations

import contextlib
import contextvars
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from celery.exceptions import SoftTimeLimitExceeded

from toolfleet.schemas.tool import Tool, is_coro_func

__all__ = ["per_call_alarm", "sync_tool_deadline"]

# Set by toolfleet.execute_many on the prefork pool for the calls of its bundle.
per_call_alarm: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "toolfleet_per_call_alarm", default=False
)


def _blocks_throughout(tool: Tool) -> bool:
    parts = (tool.func_callable, tool.preprocessor, tool.postprocessor)
    return not any(p is not None and is_coro_func(p) for p in parts)


def _expired(signum: int, frame: FrameType | None) -> None:
    raise SoftTimeLimitExceeded("the call's timeout_s expired inside a bundle")


@contextlib.contextmanager
def sync_tool_deadline(tool: Tool, timeout_s: float | None) -> Iterator[None]:
    """Interrupt a blocking sync tool after ``timeout_s`` when the bundle asked for it."""
    armed = (
        timeout_s is not None
        and timeout_s > 0
        and per_call_alarm.get()
        and threading.current_thread() is threading.main_thread()
        and _blocks_throughout(tool)
    )
    if not armed:
        yield
        return
    assert timeout_s is not None
    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
