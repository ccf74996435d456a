"""What the dispatcher says while its broker is down: three kinds of line, not one per retry.

Every part that reaches Redis (the collector, the broker watch, the history writer, the
publisher) retries through an outage on its own; each used to log every retry, so an outage
of two minutes printed hundreds of lines. They now report to the one :class:`OutageLog` of
their broker, which logs one line when the broker goes, a summary every
:data:`SUMMARY_EVERY_S` (calls waiting for results, history units not yet written), and one
line when it answers again. Each retry itself is logged at DEBUG.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from toolfleet.schemas.settings import masked_url

__all__ = ["SUMMARY_EVERY_S", "OutageLog", "broker_name", "outage_log"]

log = logging.getLogger(__name__)

SUMMARY_EVERY_S = 10.0


class OutageLog:
    """The outage state of one broker, shared by every loop and part of this process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._summary_at = 0.0
        self._waiting: dict[str, int] = {}
        self._unwritten: dict[str, int] = {}

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def down_for_s(self) -> float:
        """How long the broker has been unreachable (0.0 while it answers)."""
        since = self._down_since
        return 0.0 if since is None else time.monotonic() - since

    def failing(
        self,
        part: str,
        error: BaseException,
        *,
        waiting: int | None = None,
        unwritten: int | None = None,
    ) -> None:
        """``part`` could not reach the broker; ``waiting``/``unwritten``: what it holds now
        (calls awaiting a result, history units not yet written)."""
        now = time.monotonic()
        with self._lock:
            if waiting is not None:
                self._waiting[part] = waiting
            if unwritten is not None:
                self._unwritten[part] = unwritten
            first = self._down_since is None
            if first:
                self._down_since = self._summary_at = now
            summary = not first and now - self._summary_at >= SUMMARY_EVERY_S
            if summary:
                self._summary_at = now
            down_s = now - (self._down_since or now)
            calls, units = sum(self._waiting.values()), sum(self._unwritten.values())
        text = masked_url(str(error))
        if first:
            log.warning(
                "broker %s unreachable (%s); calls wait and history writes are retried until "
                "it answers or TOOLFLEET_OUTAGE_LIMIT_S passes (TOOLFLEET_CONNECT_LIMIT_S for a "
                "broker not reached yet); a summary follows every %gs",
                self.name,
                text,
                SUMMARY_EVERY_S,
            )
        elif summary:
            log.warning(
                "broker %s still unreachable after %.0fs (%s): %d call(s) waiting for results, "
                "%d history unit(s) not yet written",
                self.name,
                down_s,
                text,
                calls,
                units,
            )
        else:
            log.debug("broker %s: %s failed again: %s", self.name, part, text)

    def answering(self, part: str) -> None:
        """``part`` reached the broker: an outage, if one was noted, is over."""
        with self._lock:
            self._waiting.pop(part, None)
            self._unwritten.pop(part, None)
            since, self._down_since = self._down_since, None
            if since is not None:
                self._waiting.clear()
                self._unwritten.clear()
        if since is not None:
            log.warning("broker %s answers again after %.1fs", self.name, time.monotonic() - since)


_logs: dict[str, OutageLog] = {}
_logs_lock = threading.Lock()


def broker_name(client: Any) -> str:
    """The broker a redis-py client talks to, as ``host:port/db`` or ``unix:path`` (no
    password: the connection keywords are read, not the URL)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {}) or {}
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


def outage_log(client: Any) -> OutageLog:
    """The one OutageLog of the broker ``client`` talks to."""
    name = broker_name(client)
    with _logs_lock:
        found = _logs.get(name)
        if found is None:
            found = _logs[name] = OutageLog(name)
        return found
