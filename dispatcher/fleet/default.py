"""The process-default fleet: what a ``Branch()`` given no fleet uses."""

from __future__ import annotations

import threading

from toolfleet.dispatcher.fleet.handle import Fleet

__all__ = ["default_fleet"]

_default: Fleet | None = None
_default_lock = threading.Lock()


def default_fleet() -> Fleet:
    """The process-default fleet, ``Fleet.from_env()``, created on first use (once, even
    when threads ask at the same time)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Fleet.from_env()
        return _default
