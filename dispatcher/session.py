"""A conversation's governance scope: gates, event observers, signals and its branches."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.approvals import Escalate
from toolfleet.dispatcher.govern.callbacks import error_text
from toolfleet.dispatcher.govern.emitter import Emitter
from toolfleet.dispatcher.govern.extension import SESSION_HOOKS, AnyExtension, overridden
from toolfleet.dispatcher.govern.session_signals import Signal
from toolfleet.dispatcher.history.recorder import EventObserver
from toolfleet.schemas.action import ToolInvocation

__all__ = ["EventObserver", "Gate", "Session"]

_GATES = Emitter()
# A signal listener's failure is logged only: recording it would call the listener again.
_SIGNALS = Emitter()

Gate = Callable[[ToolInvocation], "Awaitable[Any] | Any"]


class Session:
    """Holds the gates every branch of this session authorizes through.

    With no gate installed every call is allowed. A gate returning a falsy value, or
    raising, denies the call; the denial is recorded in :attr:`signals` as GateDenied.
    """

    def __init__(self, fleet: Fleet | None = None, *, id: str | None = None) -> None:
        # What limit_key="session" counts per (docs/controls.md): one id per conversation.
        self.id = id or str(uuid.uuid4())
        self.fleet = fleet
        self.signals: list[Signal] = []
        self.branches: dict[str, Branch] = {}
        self._gates: list[Gate] = []
        self._observers: list[EventObserver] = []
        self._signal_listeners: list[Callable[[Signal], None]] = []

    def use(self, extension: AnyExtension) -> AnyExtension:
        """Register ``extension``'s session hooks it overrides: ``authorize`` (a gate, as
        :meth:`gate`), ``on_event`` (an observer, as :meth:`subscribe`) and ``on_signal``
        (each signal recorded); each runs in registration order, whichever call registered
        it. Returns it."""
        for name in overridden(extension, SESSION_HOOKS, "session"):
            if name == "authorize":
                self.gate(extension.authorize)
            elif name == "on_event":
                self.subscribe(extension.on_event)
            else:
                self._signal_listeners.append(extension.on_signal)
        return extension

    def gate(self, check: Gate) -> Gate:
        """Install ``check(ToolInvocation) -> bool`` (sync or async); every gate must allow.
        A gate may return ``Escalate(reason)`` to have the call approved first."""
        self._gates.append(check)
        return check

    def subscribe(self, observer: EventObserver) -> EventObserver:
        """Call ``observer(event_record)`` after each call's event is written; failures are
        isolated and recorded as CallbackFailed signals."""
        self._observers.append(observer)
        return observer

    @property
    def observers(self) -> tuple[EventObserver, ...]:
        return tuple(self._observers)

    async def authorize(self, invocation: ToolInvocation) -> str | Escalate | None:
        """None when every gate allows, else the reason the call is denied; Escalate when no
        gate denies and one asks for approval (the call is parked until someone decides)."""
        escalation: Escalate | None = None
        for check in self._gates:
            # A gate's failure is a denial, recorded by the batch as GateDenied.
            outcome = await _GATES.call(check, invocation, where=f"gate on {invocation.function}")
            name, verdict = outcome.handler, outcome.value
            if outcome.error is not None:
                return f"gate {name} raised {error_text(outcome.error)}"
            if isinstance(verdict, Escalate):
                escalation = escalation or verdict
            elif not verdict:
                return f"gate {name} returned {verdict!r}"
        return escalation

    def new_branch(self, *, id: str | None = None, fleet: Fleet | None = None) -> Branch:
        """A branch bound to this session (and to ``fleet``, else the session's fleet)."""
        return Branch(self, fleet=fleet, id=id)

    def record(self, signal: Signal) -> None:
        self.signals.append(signal)
        for listener in tuple(self._signal_listeners):
            _SIGNALS.call_now(
                listener, signal, where="on_signal", call_id=getattr(signal, "call_id", None)
            )
