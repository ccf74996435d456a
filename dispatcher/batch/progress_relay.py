"""Progress of running calls, from the collector to the caller's callbacks.

A worker pushes a tool's progress reports (``current_call().progress()``, throttled there to 10
a second per call, toolfleet.workers.progress) onto the reply list the collector already pops;
the collector hands each one to the :class:`ProgressRelay` of its batch while the call's
attempt is awaited (:meth:`toolfleet.dispatcher.watch.collector.Collector.listen`). The relay
runs the callbacks (``Branch.on_progress`` and ``act(on_progress=...)``) on a task of its own,
one report at a time in arrival order, so a call's reports arrive in the order its tool made
them, and a slow or failing callback never holds up a result. A callback that raises is
isolated like any other user callback: logged, and recorded as a ``CallbackFailed`` signal
(``where="on_progress"``). Every report queued before act() returns has been handed to the
callbacks by then.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from toolfleet.dispatcher.govern.emitter import Emitter
from toolfleet.dispatcher.govern.session_signals import Signal
from toolfleet.dispatcher.infra.stopping import cancel_and_wait
from toolfleet.schemas.progress import CallProgress, ProgressReport

__all__ = ["ProgressCallback", "ProgressRelay"]


ProgressCallback = Callable[[CallProgress], "Awaitable[Any] | Any"]


class ProgressRelay:
    """Runs one batch's progress callbacks, in arrival order, off the collector's task."""

    def __init__(
        self,
        callbacks: Sequence[ProgressCallback],
        *,
        branch_id: str,
        signal: Callable[[Signal], None],
    ) -> None:
        self._callbacks = list(callbacks)
        self._branch_id = branch_id
        self._emitter = Emitter(signal, owner=f"branch {branch_id}")
        self._queue: deque[CallProgress] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False

    def push(self, report: ProgressReport) -> None:
        """Queue one report (the collector's listener; never blocks, never raises)."""
        if self._closed:
            return
        self._queue.append(
            CallProgress(
                call_id=report.call_id,
                tool=report.function,
                done=report.done,
                total=report.total,
                message=report.message,
                attempt=report.attempt,
                reported_at=report.at,
            )
        )
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"toolfleet-progress:{self._branch_id}"
            )

    async def aclose(self, *, drain: bool = True) -> None:
        """Stop, after the queued reports have been handed over (``drain``) or at once."""
        self._closed = True
        task, self._task = self._task, None
        if task is None:
            return
        if drain:
            self._closing = True
            self._wake.set()
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                await cancel_and_wait(task)
                raise
        else:
            await cancel_and_wait(task)
        self._queue.clear()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                progress = self._queue.popleft()
                for callback in self._callbacks:
                    await self._emitter.call(
                        callback, progress, where="on_progress", call_id=progress.call_id
                    )
            if self._closing:
                return
