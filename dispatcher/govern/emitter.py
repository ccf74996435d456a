"""The one place toolfleet calls a user's code and survives its failure.

Every kind of callback goes through :class:`Emitter` — hook handlers, gates, event observers,
message and progress callbacks, approval handlers and extension methods — so a failure is
treated one way everywhere: an ordinary ``Exception`` is isolated, logged with the callback's
qualified name and recorded as a ``CallbackFailed`` signal (when the emitter has a signal
sink); ``BaseException`` (cancellation, KeyboardInterrupt, SystemExit) is never caught.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolfleet.dispatcher.govern.callbacks import call_user, callback_name, error_text
from toolfleet.dispatcher.govern.session_signals import CallbackFailed, Signal
from toolfleet.schemas.errors import WrongTypeError

__all__ = ["Emitter", "Outcome"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one call of user code gave: its value, or the error it raised (isolated)."""

    handler: str
    value: Any = None
    error: Exception | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


class Emitter:
    """Calls user code for one owner (a branch, a session, a fleet) and isolates failures.

    ``signal`` receives a ``CallbackFailed`` for each failure; without one (a gate, whose
    failure is a denial recorded as ``GateDenied``) failures are only logged and returned.
    """

    def __init__(self, signal: Callable[[Signal], None] | None = None, *, owner: str = "") -> None:
        self._signal = signal
        self._owner = owner

    async def call(
        self,
        callback: Callable[..., Any],
        *args: Any,
        where: str,
        call_id: str | None = None,
        passthrough: tuple[type[Exception], ...] = (),
    ) -> Outcome:
        """``callback(*args)``, awaited when it returns an awaitable. An ``Exception`` is
        logged, signalled and returned in the outcome, except those in ``passthrough``
        (control flow such as ``StopHook``), which propagate like ``BaseException`` does."""
        name = callback_name(callback)
        try:
            value = await call_user(callback, *args)
        except passthrough:
            raise
        except Exception as exc:
            return self._failed(name, exc, where, call_id)
        return Outcome(name, value=value)

    def call_now(
        self, callback: Callable[..., Any], *args: Any, where: str, call_id: str | None = None
    ) -> Outcome:
        """``callback(*args)`` for a hook that runs where it is raised, outside any await (a
        signal listener); an awaitable it returns is closed and counts as its failure."""
        name = callback_name(callback)
        try:
            value = callback(*args)
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()
                raise WrongTypeError(f"{where} must be a plain function, not a coroutine function")
        except Exception as exc:
            return self._failed(name, exc, where, call_id)
        return Outcome(name, value=value)

    def _failed(self, name: str, exc: Exception, where: str, call_id: str | None) -> Outcome:
        text = error_text(exc)
        owner = f"{self._owner}: " if self._owner else ""
        on_call = f" on call {call_id}" if call_id else ""
        log.warning("%s%s %s failed%s: %s", owner, where, name, on_call, text)
        if self._signal is not None:
            self._signal(CallbackFailed(call_id, where, name, text))
        return Outcome(name, error=exc)
