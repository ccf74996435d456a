"""Celery signal handlers per toolfleet app, with one receiver per signal per process.

Celery's signals are process-global. An app that connected its own closures would add a
receiver per ``create_app()`` (a test suite makes dozens) and, connected strongly, keep every
app alive. Instead each signal gets one toolfleet receiver, connected when the first app needs
it; it hands the signal to the handlers of the app the sender belongs to (``sender.app``:
the worker, consumer or task). An app's handlers go when the app is closed or collected, and
the receivers go with the last app.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.utils.dispatch import Signal

__all__ = ["RECEIVER_UID", "connect", "detach", "live_apps"]

# The dispatch_uid of every toolfleet receiver: one per signal, whatever the app count.
RECEIVER_UID = "toolfleet.app_signals"

Handler = Callable[..., None]

# Re-entrant: the garbage collector may run an old app's finalizer (``_forget``) on this very
# thread while ``connect`` holds the lock (any allocation there can start a collection); a
# plain lock would deadlock the thread on itself.
_lock = threading.RLock()
# id(app) → a weak reference to the app: an app nobody holds is collected even if it was never
# closed. Its handlers live on the app itself (they refer to it), never in this module.
_apps: dict[int, weakref.ref[Celery]] = {}
_connected: set[Signal] = set()
_HANDLERS = "toolfleet_signal_handlers"


def connect(app: Celery, signal: Signal, handler: Handler) -> None:
    """Call ``handler(sender=..., **kwargs)`` when ``signal`` fires for ``app``."""
    with _lock:
        ref = _apps.get(id(app))
        if ref is None or ref() is not app:
            _apps[id(app)] = weakref.ref(app)
            weakref.finalize(app, _forget, id(app))
        handlers: dict[Signal, list[Handler]] = app.__dict__.setdefault(_HANDLERS, {})
        handlers.setdefault(signal, []).append(handler)
        if signal not in _connected:
            signal.connect(_receive, weak=False, dispatch_uid=RECEIVER_UID)
            _connected.add(signal)


def detach(app: Celery) -> None:
    """Drop ``app``'s handlers; with no app left, disconnect the receivers."""
    app.__dict__.pop(_HANDLERS, None)
    _forget(id(app), app)


def live_apps() -> list[Celery]:
    """The apps that have handlers now (for tests and diagnostics)."""
    with _lock:
        apps = [ref() for ref in _apps.values()]
    return [app for app in apps if app is not None]


def _forget(key: int, app: Celery | None = None) -> None:
    with _lock:
        ref = _apps.get(key)
        # By id: a finalizer runs after its app is gone, and the id may be reused by then.
        if ref is not None and ref() in (None, app):
            del _apps[key]
        if not _apps:
            for signal in _connected:
                signal.disconnect(_receive, dispatch_uid=RECEIVER_UID)
            _connected.clear()


def _receive(signal: Signal | None = None, sender: Any = None, **kwargs: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None or signal is None:
        return
    with _lock:
        ref = _apps.get(id(app))
        if ref is None or ref() is not app:
            return
        handlers = list(app.__dict__.get(_HANDLERS, {}).get(signal, ()))
    for handler in handlers:
        handler(sender=sender, **kwargs)
