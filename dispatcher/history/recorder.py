"""A branch's history recorder: the last step of a call, once every earlier call is written.

Per run of units, in input order: TOOL_POST or TOOL_ERROR handlers, then each unit whole into
the branch's history (C5, ``toolfleet.dispatcher.history.history``), then the session's event
observers and the branch's message callbacks. Handler, observer and callback failures are isolated
and become ``CallbackFailed`` signals; a Redis write that fails becomes ``HistoryWriteFailed``.

A batch (``toolfleet.dispatcher.batch.act``) receives the recorder; it never reaches into the
branch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from toolfleet.broker import tracing
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.emitter import Emitter
from toolfleet.dispatcher.govern.hooks import HookBus
from toolfleet.dispatcher.govern.session_signals import HistoryWriteFailed, Signal
from toolfleet.dispatcher.history.durable import Progress
from toolfleet.dispatcher.history.history import BranchHistory, Unit
from toolfleet.schemas.messages import Message
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.status import EventStatus

__all__ = ["EventObserver", "HistoryRecorder", "MessageCallback", "Progress", "SignalSink"]

EventObserver = Callable[[EventRecord], "Awaitable[Any] | Any"]
MessageCallback = Callable[[Message], "Awaitable[Any] | Any"]
SignalSink = Callable[[Signal], None]


class HistoryRecorder:
    """Writes a branch's units in order, with their hooks, observers and callbacks."""

    def __init__(
        self,
        branch_id: str,
        *,
        hooks: HookBus,
        signal: SignalSink,
        observers: Callable[[], Sequence[EventObserver]],
        callbacks: Sequence[MessageCallback],
    ) -> None:
        self.branch_id = branch_id
        self.hooks = hooks
        self.signal = signal
        # Every user callback of this branch is called, and its failure signalled, here.
        self.emitter = Emitter(signal, owner=f"branch {branch_id}")
        self.history = BranchHistory(branch_id)
        self._observers = observers
        # The branch's own list: callbacks added later are called too.
        self._callbacks = callbacks

    async def write(
        self, units: Sequence[Unit], fleet: Fleet, *, progress: Progress | None = None
    ) -> None:
        """TOOL_POST/TOOL_ERROR, then each unit whole (C5), then observers and callbacks."""
        for unit in units:
            if unit.hook_point is None:
                continue
            await self.hooks.emit(unit.hook_point, unit.hook_payload, self.emitter)
        attributes = {tracing.ATTR_BRANCH_ID: self.branch_id, "toolfleet.calls": len(units)}
        with tracing.span("toolfleet.history.write", attributes) as span:
            failure_text = await self.history.write(
                fleet.redis,
                fleet.keys,
                units,
                record_ttl_s=fleet.settings.record_ttl_s,
                progress=progress,
            )
            if failure_text is not None and span is not None:
                error_type = self.history.durable.last_error_type
                tracing.set_call_status(span, EventStatus.FAILED, error_type=error_type)
        if failure_text is not None:
            unwritten = self.history.durable.unwritten
            self.signal(
                HistoryWriteFailed(
                    units[0].call_id,
                    self.branch_id,
                    f"{failure_text}; {unwritten} call(s) kept and retried in order",
                    unwritten=unwritten,
                )
            )
        observers = self._observers()
        for unit in units:
            for record in unit.events:
                for observer in observers:
                    await self.emitter.call(
                        observer, record, where="observer", call_id=unit.call_id
                    )
            for message in (unit.request, unit.response):
                for callback in self._callbacks:
                    await self.emitter.call(
                        callback, message, where="on_message", call_id=unit.call_id
                    )
