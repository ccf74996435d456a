"""A conversation branch: where tool calls are acted on and their history is kept."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from toolfleet.broker import tracing
from toolfleet.dispatcher.accept.context import CallContext
from toolfleet.dispatcher.batch.act import Batch
from toolfleet.dispatcher.batch.progress_relay import ProgressCallback
from toolfleet.dispatcher.fleet import Fleet, default_fleet
from toolfleet.dispatcher.govern.approvals import Escalate
from toolfleet.dispatcher.govern.extension import BRANCH_HOOKS, AnyExtension, overridden
from toolfleet.dispatcher.govern.hooks import HookBus, HookPoint
from toolfleet.dispatcher.govern.session_signals import Signal
from toolfleet.dispatcher.history.compact import CompactList
from toolfleet.dispatcher.history.history import load_records
from toolfleet.dispatcher.history.recorder import EventObserver, HistoryRecorder, MessageCallback
from toolfleet.dispatcher.history.recover import recover_branch
from toolfleet.schemas.action import ActionResponseModel, CallParams, ToolInvocation
from toolfleet.schemas.messages import Message
from toolfleet.schemas.record import EventRecord

__all__ = ["Branch", "MessageCallback", "ProgressCallback", "Scope"]

# The Extension methods that are lifecycle hook points.
_HOOK_POINTS = {
    "before_call": HookPoint.TOOL_PRE,
    "after_call": HookPoint.TOOL_POST,
    "call_failed": HookPoint.TOOL_ERROR,
}


class Scope(Protocol):
    """What a branch needs of its session (``toolfleet.dispatcher.session.Session`` is one):
    a Protocol, so a branch never imports the session that creates it."""

    fleet: Fleet | None
    branches: dict[str, Any]

    @property
    def observers(self) -> Sequence[EventObserver]: ...

    async def authorize(self, invocation: ToolInvocation) -> str | Escalate | None: ...

    def record(self, signal: Signal) -> None: ...


class Branch:
    """Acts on tool calls over a fleet and records each call's event and message pair.

    A branch without a session authorizes every call. The fleet is, in order: ``fleet``,
    the session's fleet, or the process-default ``Fleet.from_env()`` created on first use
    (``TOOLFLEET_*`` environment variables configure it).
    """

    def __init__(
        self,
        session: Scope | None = None,
        *,
        fleet: Fleet | None = None,
        id: str | None = None,
    ) -> None:
        self.id = id or str(uuid.uuid4())
        self.session = session
        self._fleet = fleet
        self.hooks = HookBus()
        # Signals of this branch; also appended to the session's signals when bound.
        self.signals: list[Signal] = []
        self._message_callbacks: list[MessageCallback] = []
        self._progress_callbacks: list[ProgressCallback] = []
        self._recorder = HistoryRecorder(
            self.id,
            hooks=self.hooks,
            signal=self._signal,
            observers=lambda: self.session.observers if self.session is not None else (),
            callbacks=self._message_callbacks,
        )
        if session is not None:
            session.branches[self.id] = self

    @property
    def fleet(self) -> Fleet:
        if self._fleet is not None:
            return self._fleet
        if self.session is not None and self.session.fleet is not None:
            return self.session.fleet
        return default_fleet()

    @property
    def messages(self) -> CompactList[Message]:
        """The history: ActionRequest, then its linked ActionResponse, per call, in order.

        A read-only sequence: the newest messages are the objects written, older ones are
        kept compressed and decoded on access (toolfleet.dispatcher.history.compact)."""
        return self._recorder.history.messages

    @property
    def events(self) -> list[EventRecord]:
        """The logged execution records (one per attempt; ABORTED for calls never run).

        A new list on each access, decoded from the compact form; ``record.to_dict()`` is the
        JSON object stored in Redis."""
        return list(self._recorder.history.events)

    def use(self, extension: AnyExtension) -> AnyExtension:
        """Register ``extension``'s branch hooks it overrides: ``before_call`` (TOOL_PRE),
        ``after_call`` (TOOL_POST), ``call_failed`` (TOOL_ERROR), ``on_message`` and
        ``on_progress``. Each point runs its callbacks in registration order, those of
        :meth:`on_message`, :meth:`on_progress` and ``hooks.on`` included; returns it."""
        for name in overridden(extension, BRANCH_HOOKS, "branch"):
            method = getattr(extension, name)
            if name in _HOOK_POINTS:
                self.hooks.on(_HOOK_POINTS[name], method)
            elif name == "on_message":
                self.on_message(method)
            else:
                self.on_progress(method)
        return extension

    def on_message(self, callback: MessageCallback) -> MessageCallback:
        """Call ``callback(message)`` after each message is written; failures are isolated
        and recorded as CallbackFailed signals."""
        self._message_callbacks.append(callback)
        return callback

    def on_progress(self, callback: ProgressCallback) -> ProgressCallback:
        """Call ``callback(progress)`` (a ``CallProgress``: call_id, tool, done, total,
        message) for each progress report of this branch's running calls, in the order each
        tool made them, at most 10 a second per call (docs/controls.md). Registered before
        act(); failures are isolated and recorded as CallbackFailed signals. With no
        callback, workers send nothing."""
        self._progress_callbacks.append(callback)
        return callback

    async def authorize(self, ctx: CallContext) -> str | Escalate | None:
        """None to allow ``ctx``, else the denial reason, or Escalate to have it approved
        first. Standalone branches allow all."""
        if self.session is None:
            return None
        return await self.session.authorize(ctx.invocation())

    async def act(
        self,
        action_request: Any,
        *,
        strategy: str = "concurrent",
        verbose_action: bool = False,
        suppress_errors: bool = True,
        call_params: CallParams | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> list[ActionResponseModel]:
        """Run one call or a list of calls on the fleet; one result per call, input order.

        Each request is an ActionRequest, a model with ``function`` and ``arguments``, or a
        dict with both keys. ``suppress_errors=False`` raises a malformed request before
        anything is enqueued, and a call's manager or TOOL_PRE exception after the history
        of the calls in flight is written. ``call_params`` sets retries, per-call timeout,
        the in-flight window (default ``settings.max_in_flight``), throttle,
        ``return_exceptions`` (exceptions in their slots) and ``output_dropna``.
        ``on_progress``: a progress callback for this act()'s calls only, besides the
        branch's (:meth:`on_progress`).
        """
        progress = [*self._progress_callbacks, *([on_progress] if on_progress else [])]
        batch = Batch(
            self.fleet,
            action_request,
            recorder=self._recorder,
            authorize=self.authorize,
            strategy=strategy,
            verbose_action=verbose_action,
            suppress_errors=suppress_errors,
            call_params=call_params,
            on_progress=progress,
            session_id=getattr(self.session, "id", None),
        )
        if not batch.items:
            return []
        attributes = {
            tracing.ATTR_BRANCH_ID: self.id,
            "toolfleet.calls": len(batch.items),
            "toolfleet.strategy": strategy,
        }
        with tracing.span("toolfleet.act", attributes):
            return await batch.run()

    def act_sync(
        self,
        action_request: Any,
        *,
        strategy: str = "concurrent",
        verbose_action: bool = False,
        suppress_errors: bool = True,
        call_params: CallParams | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> list[ActionResponseModel]:
        """:meth:`act` for synchronous code: runs the batch on a private event loop and
        closes the fleet's clients of that loop before returning. Same arguments, same
        results; callable again, and from any thread that runs no event loop (the caller's
        contextvars carry over). Inside a running loop it raises RuntimeError: await
        :meth:`act` there."""
        from toolfleet.dispatcher.sync_run import run_sync

        fleet = self.fleet
        return run_sync(
            lambda: self.act(
                action_request,
                strategy=strategy,
                verbose_action=verbose_action,
                suppress_errors=suppress_errors,
                call_params=call_params,
                on_progress=on_progress,
            ),
            close=fleet.aclose,
        )

    @classmethod
    async def load(
        cls,
        branch_id: str,
        *,
        fleet: Fleet | None = None,
        session: Scope | None = None,
    ) -> Branch:
        """A branch with the history and events stored under ``branch_id`` in Redis."""
        branch = cls(session, fleet=fleet, id=branch_id)
        f = branch.fleet
        messages, events = await load_records(f.redis, f.keys, branch_id)
        branch._recorder.history.messages.extend(messages)
        branch._recorder.history.events.extend(events)
        return branch

    @classmethod
    async def recover(
        cls,
        branch_id: str,
        *,
        fleet: Fleet | None = None,
        session: Scope | None = None,
        wait_s: float = 300.0,
    ) -> Branch:
        """Complete the open batches of ``branch_id`` whose dispatcher is gone:
        wait up to ``wait_s`` for their calls still queued or running, write every missing
        unit in input order (a call never enqueued as ABORTED), then load the branch.
        Recovering twice writes nothing twice."""
        await recover_branch(branch_id, fleet or default_fleet(), wait_s=wait_s)
        return await cls.load(branch_id, fleet=fleet, session=session)

    def _signal(self, signal: Signal) -> None:
        self.signals.append(signal)
        if self.session is not None:
            self.session.record(signal)
