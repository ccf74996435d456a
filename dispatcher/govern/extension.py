"""One way to plug into a batch's life: a subclass of :class:`Extension`.

Override only the methods you need; each may be a plain method or a coroutine method. Who
calls which method (register with ``use(ext)`` on the owner):

- ``branch.use(ext)``: :meth:`~Extension.before_call`, :meth:`~Extension.after_call`,
  :meth:`~Extension.call_failed`, :meth:`~Extension.on_message`, :meth:`~Extension.on_progress`;
- ``session.use(ext)``: :meth:`~Extension.authorize`, :meth:`~Extension.on_event`,
  :meth:`~Extension.on_signal`;
- ``fleet.use(ext)``: :meth:`~Extension.on_approval`.

The older registration calls (``branch.hooks.on``, ``branch.on_message``,
``branch.on_progress``, ``session.gate``, ``session.subscribe``, ``fleet.on_approval``) put
their callback in the same per-point list ``use()`` does, so every point runs its callbacks
in registration order, whichever call registered them. Only the methods an extension
overrides are registered (a branch with no progress callback still asks workers for no
progress reports). Every method is called through the one emitter
(``toolfleet.dispatcher.govern.emitter``): a failure of the non-blocking ones is isolated,
logged and recorded as a ``CallbackFailed`` signal (docs/api.md, "Extending a batch").
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, TypeVar

from toolfleet.schemas.errors import ConfigurationError

if TYPE_CHECKING:
    from toolfleet.dispatcher.govern.session_signals import Signal
    from toolfleet.schemas.action import ToolInvocation
    from toolfleet.schemas.approval import ApprovalRequest
    from toolfleet.schemas.messages import Message
    from toolfleet.schemas.progress import CallProgress
    from toolfleet.schemas.record import EventRecord

__all__ = [
    "BRANCH_HOOKS",
    "FLEET_HOOKS",
    "SESSION_HOOKS",
    "AnyExtension",
    "Extension",
    "overridden",
]

# The methods each owner's use() registers, in the order a call meets them.
BRANCH_HOOKS = ("before_call", "after_call", "call_failed", "on_message", "on_progress")
SESSION_HOOKS = ("authorize", "on_event", "on_signal")
FLEET_HOOKS = ("on_approval",)


class Extension:
    """A base of no-op hooks into a batch's life; subclass it and override what you need.

    A call meets them in this order: ``authorize`` (session gate) → ``before_call``
    (TOOL_PRE) → ``on_approval`` (only for a call parked for approval) → the tool runs, with
    ``on_progress`` for each of its reports → ``after_call`` (TOOL_POST; a call stopped
    before it was sent gets ``call_failed``, TOOL_ERROR, instead) → the call's event and
    messages are written → ``on_event`` for each event record → ``on_message`` for its
    request, then its response.
    """

    def authorize(self, invocation: ToolInvocation) -> Any:
        """Session gate (D2): return True to allow, a falsy value to deny (recorded as
        GateDenied), or ``Escalate(reason)`` to have the call approved first; raising denies.
        Receives the call as the tool will see it."""
        return True

    def before_call(self, payload: dict[str, Any]) -> Any:
        """TOOL_PRE, before the call is sent: payload keys ``point``, ``tool_name``,
        ``call_id``, ``arguments`` (a summary), ``branch_id``, ``context`` (a
        ``CallContext`` with secrets masked) and, after an approval, ``approval``. Raising
        aborts this call (C3); ``ApprovalRequired`` parks it for approval; ``StopHook`` skips
        the remaining TOOL_PRE handlers."""

    def after_call(self, payload: dict[str, Any]) -> Any:
        """TOOL_POST, once a call that was sent has ended (any status), before it is
        written: payload keys ``point``, ``tool_name``, ``call_id``, ``branch_id``,
        ``status``, ``response`` (a summary), ``duration``, ``error`` (text or None). A
        failure is isolated and signalled."""

    def call_failed(self, payload: dict[str, Any]) -> Any:
        """TOOL_ERROR, for a call stopped before or while it was sent (ABORTED, C3), before
        it is written: payload keys ``point``, ``tool_name``, ``call_id``, ``branch_id``,
        ``error`` (the exception), ``duration`` (None). A failure is isolated and signalled."""

    def on_event(self, record: EventRecord) -> Any:
        """Each event record of a call, after it is written to the branch's history."""

    def on_message(self, message: Message) -> Any:
        """Each message of a call (its ActionRequest, then its ActionResponse), after it is
        written."""

    def on_progress(self, progress: CallProgress) -> Any:
        """Each progress report of a running call, in the order its tool made them."""

    def on_signal(self, signal: Signal) -> None:
        """Each signal the session records (``GateDenied``, ``CallbackFailed``,
        ``HistoryWriteFailed``), right after it is appended to ``session.signals``. A plain
        method: it runs where the signal is raised. A failure is logged, not signalled (the
        signal would call it again)."""

    def on_approval(self, request: ApprovalRequest) -> Any:
        """A call of this process was parked for approval: True approves, False denies, None
        leaves it to the next handler or another decider. A failure is isolated and
        signalled, and the next handler is asked."""
        return None


# use() returns the extension it was given, with its own type.
AnyExtension = TypeVar("AnyExtension", bound=Extension)


def overridden(extension: Extension, names: tuple[str, ...], owner: str) -> list[str]:
    """The hook methods of ``names`` that ``extension`` overrides, in that order; a clear
    error when it is no Extension or overrides none of them (nothing would be called)."""
    if not isinstance(extension, Extension):
        raise ConfigurationError(
            f"{owner}.use() takes a toolfleet.Extension instance, got {extension!r}; subclass "
            "Extension and override the hooks you need"
        )
    chosen = [n for n in names if getattr(type(extension), n) is not getattr(Extension, n)]
    if not chosen:
        raise ConfigurationError(
            f"{type(extension).__qualname__} overrides none of the hooks {owner}.use() "
            f"registers ({', '.join(names)}); register it where its hooks are called "
            "(branch.use, session.use or fleet.use)"
        )
    if "on_signal" in chosen and inspect.iscoroutinefunction(type(extension).on_signal):
        raise ConfigurationError(
            f"{type(extension).__qualname__}.on_signal is a coroutine function; make it a "
            "plain method (it runs where the signal is raised, outside any await)"
        )
    return chosen
