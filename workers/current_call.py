"""``current_call()``: what a tool body may ask of the call it is running, on the worker::

    from toolfleet import current_call, tool

    @tool
    def crunch(rows: list[int]) -> int:
        call = current_call()
        for i, row in enumerate(rows, 1):
            ...
            call.progress(i, total=len(rows), message=f"row {i}")

The call runner (:mod:`toolfleet.workers.call_runner`) keeps the message being run in
:data:`running_message` for the whole execution, and binds one :class:`CurrentCall` (with the
tool's span, for progress) around the tool itself, its preprocessor and postprocessor
included. Both are context variables: right for a sync tool on its process's thread and for the
coroutines sharing an async worker's loop alike (Celery's ``task.request`` is a thread-local
stack), and copied into the tasks and ``asyncio.to_thread`` calls the tool makes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from toolfleet.schemas.errors import NoCurrentCallError
from toolfleet.schemas.function_calling import GRAPH_RESUME_KEY
from toolfleet.schemas.progress import check_progress
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.wire import CallMessage
from toolfleet.workers.graph_context import graph_context
from toolfleet.workers.progress import ProgressReporter, sender_for

__all__ = ["CurrentCall", "bind_call", "current_call", "running_message"]


class CurrentCall:
    """The call a tool is running: its ids, and :meth:`progress` to report how far it got."""

    __slots__ = ("_reporter", "_settings", "_span", "message")

    def __init__(
        self, message: CallMessage, settings: Settings | None = None, span: Any = None
    ) -> None:
        self.message = message
        self._settings = settings
        self._span = span
        self._reporter: ProgressReporter | None = None

    @property
    def call_id(self) -> str:
        return self.message.call_id

    @property
    def idempotency_key(self) -> str:
        """The effect key: the call_id (C7), the same for every run of this call (a
        redelivery, a re-run after its worker was lost, a dispatcher's recovery, a retry of a
        FAILED attempt, a model's replay of the same tool_call_id on the same branch) and
        different for every other call. Send it as the ``Idempotency-Key`` of an API request
        with an effect, so a run the fleet repeats is one effect there too
        (docs/controls.md)."""
        return self.message.call_id

    @property
    def function(self) -> str:
        """The tool's name."""
        return self.message.function

    @property
    def attempt(self) -> int:
        return self.message.attempt

    @property
    def branch_id(self) -> str | None:
        return self.message.branch_id

    @property
    def tool_call_id(self) -> str | None:
        """The model's id of the call, when it gave one."""
        return self.message.tool_call_id

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress: ``done`` of ``total`` (None: unknown), with an optional line of
        text. Returns at once and never raises for Redis (toolfleet.workers.progress: at most
        10 reports a second reach the dispatcher, the last one always). Raises TypeError or
        ValueError for a ``done``/``total`` that is not a finite number, or a non-str
        ``message``."""
        checked = check_progress(done, total, message)
        reporter = self._reporter
        if reporter is None:
            if self._settings is None:
                return  # outside the tool's own run (no span, no broker to report to)
            listening = self.message.progress and bool(self.message.reply_to)
            traced = self._span is not None and self._span.is_recording()
            if not (listening or traced):
                return  # nobody asked: nothing to send, nothing to record
            reporter = self._reporter = ProgressReporter(
                self.message, sender_for(self._settings), self._span, listening=listening
            )
        reporter.report(*checked)

    async def settle(self) -> None:
        """End reporting; the last report reaches Redis before the call's record does."""
        if self._reporter is not None:
            await self._reporter.settle()

    def close(self) -> None:
        """End reporting without waiting (the call is being cancelled)."""
        if self._reporter is not None:
            self._reporter.close()


# The message being run, for the whole execution (C7 start to record).
running_message: contextvars.ContextVar[CallMessage | None] = contextvars.ContextVar(
    "toolfleet_running_message", default=None
)
# The call as its tool sees it, while the tool runs.
_current: contextvars.ContextVar[CurrentCall | None] = contextvars.ContextVar(
    "toolfleet_current_call", default=None
)


def current_call() -> CurrentCall:
    """The call the running tool belongs to. NoCurrentCallError outside a tool run by a
    worker (a tool called directly has no call: pass what it needs as arguments)."""
    call = _current.get()
    if call is not None:
        return call
    message = running_message.get()
    if message is not None:
        return CurrentCall(message)
    raise NoCurrentCallError(
        "current_call() is only available inside a tool run by a toolfleet worker; a tool "
        "called directly has no call (pass what it needs as arguments)"
    )


@contextlib.contextmanager
def bind_call(call: CurrentCall) -> Iterator[CurrentCall]:
    """Make ``call`` what :func:`current_call` returns inside the block."""
    token = _current.set(call)
    try:
        # get_stream_writer() of a LangGraph tool: its progress; interrupt(): its resume values
        with graph_context(call.progress, call.message.arguments.get(GRAPH_RESUME_KEY)):
            yield call
    finally:
        _current.reset(token)
