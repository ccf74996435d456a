"""A tool's progress reports, from ``current_call().progress()`` to its dispatcher and its span.

**Throttled per call attempt.** A report goes out at once when the call's previous one went out
at least :data:`INTERVAL_S` (0.1 s) ago; otherwise it waits, and a newer report replaces it, so
at most 10 reports a second leave a call however often its tool reports. When the call ends,
the report still waiting goes out at once (possibly sooner than 0.1 s after the previous one),
before the call's record: the tool's last report is never dropped, unless Redis refuses it.

**Never in the tool's way.** ``progress()`` only records the report and wakes one daemon thread
per process (:class:`ProgressSender`), which pushes what is due onto the dispatcher's reply list
in one pipeline with a blocking client of its own (2 s timeouts): an async tool never waits on
its loop, a sync tool never waits on Redis. A report Redis refuses is dropped, and logged once
per call; nothing is raised into the tool. The runner waits at most :data:`SETTLE_S` for a
call's last report before it writes the record.

**Free when nobody listens.** Reports go to Redis only when the call's message asks for them
(:attr:`toolfleet.schemas.wire.CallMessage.progress`: the dispatcher has a progress callback),
and the thread starts on the first report that needs it. Each report that goes out is also a
``toolfleet.progress`` event (``done``, ``total``, ``message``, at the time the tool reported)
on the tool's ``toolfleet.tool <function>`` span, when that span is recorded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from toolfleet.broker.redis_url import sync_client
from toolfleet.schemas.progress import ProgressReport, encode
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.wire import CallMessage
from toolfleet.workers.app_info import redis_url_from

__all__ = ["INTERVAL_S", "SETTLE_S", "ProgressReporter", "ProgressSender", "sender_for"]

log = logging.getLogger(__name__)

# At most one report per call per this many seconds reaches Redis (the last one excepted).
INTERVAL_S = 0.1
# How long the runner waits for a call's last report to reach Redis before its record.
SETTLE_S = 2.0
# The sender's client gives up on Redis after this long (a stalled broker drops reports).
_REDIS_TIMEOUT_S = 2.0
SPAN_EVENT = "toolfleet.progress"


@dataclass(frozen=True, slots=True)
class _Report:
    seq: int
    done: float
    total: float | None
    message: str | None
    at: float  # epoch seconds
    at_ns: int


class ProgressReporter:
    """The progress of one call attempt: throttles its reports and hands them to the sender.

    ``listening``: the dispatcher asked for reports (else only the span gets them); ``span``:
    the tool's span, or None."""

    def __init__(
        self, message: CallMessage, sender: ProgressSender, span: Any, *, listening: bool
    ) -> None:
        self.message = message
        self.listening = listening and bool(message.reply_to)
        self.span = span
        self._sender = sender
        self._lock = threading.Lock()
        self._seq = 0
        self._pending: _Report | None = None
        self._scheduled = False
        self._inflight = False
        self._last_sent_s = float("-inf")
        self._closed = False
        self._settled: concurrent.futures.Future[None] | None = None
        self._warned = False

    def report(self, done: float, total: float | None, message: str | None) -> None:
        """Record a report (already checked); schedule it as the throttle allows."""
        now = time.time()
        with self._lock:
            if self._closed:
                return  # a thread of the tool's that outlived the call
            self._seq += 1
            self._pending = _Report(self._seq, done, total, message, now, time.time_ns())
            if self._scheduled:
                return  # the scheduled send takes the newest report
            self._scheduled = True
            due_s = max(time.monotonic(), self._last_sent_s + INTERVAL_S)
        self._sender.schedule(self, due_s)

    def close(self) -> concurrent.futures.Future[None] | None:
        """No more reports; the waiting one goes out now. The future resolves once every
        report has been sent (or dropped); None when nothing is left to send."""
        with self._lock:
            self._closed = True
            if self._pending is None and not self._inflight:
                return None
            self._settled = concurrent.futures.Future()
            expedite = self._pending is not None
        if expedite:
            self._sender.schedule(self, time.monotonic())
        return self._settled

    async def settle(self) -> None:
        """:meth:`close`, then wait (at most :data:`SETTLE_S`) for the last report to be sent."""
        settled = self.close()
        if settled is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SETTLE_S):
                await asyncio.wrap_future(settled)

    def take(self) -> _Report | None:
        """The report to send now (the sender thread); None when a newer send took it."""
        with self._lock:
            report, self._pending = self._pending, None
            if report is None:
                return None
            self._scheduled = False
            self._inflight = True
            self._last_sent_s = time.monotonic()
            return report

    def sent(self, error: BaseException | None) -> None:
        """The sender is done with the report :meth:`take` gave it."""
        if error is not None and not self._warned:
            self._warned = True
            log.warning(
                "call %s (%s): a progress report did not reach Redis (%s: %s); it is dropped, "
                "the call goes on, and later failures of this call's reports are not logged",
                self.message.call_id,
                self.message.function,
                type(error).__name__,
                error,
            )
        with self._lock:
            self._inflight = False
            settled = self._settled
            finished = self._closed and self._pending is None
        if finished and settled is not None and not settled.done():
            settled.set_result(None)

    def payload(self, report: _Report) -> str:
        msg = self.message
        return encode(
            ProgressReport(
                call_id=msg.call_id,
                attempt=msg.attempt,
                function=msg.function,
                done=report.done,
                total=report.total,
                message=report.message,
                seq=report.seq,
                at=report.at,
            )
        )

    def add_span_event(self, report: _Report) -> None:
        span = self.span
        if span is None or not span.is_recording():
            return
        attributes: dict[str, Any] = {"done": report.done, "seq": report.seq}
        if report.total is not None:
            attributes["total"] = report.total
        if report.message is not None:
            attributes["message"] = report.message
        span.add_event(SPAN_EVENT, attributes, timestamp=report.at_ns)


class ProgressSender:
    """One daemon thread per process that sends what the reporters have due, in one pipeline."""

    def __init__(self, redis_url: str, ttl_s: int) -> None:
        self._client = sync_client(
            redis_url, socket_timeout=_REDIS_TIMEOUT_S, socket_connect_timeout=_REDIS_TIMEOUT_S
        )
        self._ttl_s = ttl_s
        self._wake = threading.Condition()
        self._due: list[tuple[float, int, ProgressReporter]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, reporter: ProgressReporter, due_s: float) -> None:
        with self._wake:
            heapq.heappush(self._due, (due_s, next(self._order), reporter))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="toolfleet-progress", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    timeout = self._due[0][0] - time.monotonic() if self._due else None
                    self._wake.wait(timeout)
                reporters = []
                now = time.monotonic()
                while self._due and self._due[0][0] <= now:
                    reporters.append(heapq.heappop(self._due)[2])
            try:
                self._send(reporters)
            except Exception:  # never let the thread die: later calls need it
                log.exception("progress sender: unexpected error; its reports are dropped")

    def _send(self, reporters: list[ProgressReporter]) -> None:
        taken = [(r, report) for r in reporters if (report := r.take()) is not None]
        if not taken:
            return
        by_list: dict[str, list[str]] = {}
        for reporter, report in taken:
            reporter.add_span_event(report)
            if reporter.listening and reporter.message.reply_to:
                by_list.setdefault(reporter.message.reply_to, []).append(reporter.payload(report))
        error: BaseException | None = None
        if by_list:
            try:
                pipe = self._client.pipeline(transaction=False)
                for reply_to, payloads in by_list.items():
                    pipe.rpush(reply_to, *payloads)
                    pipe.expire(reply_to, self._ttl_s)
                pipe.execute()
            except (redis.RedisError, OSError) as exc:
                error = exc
        for reporter, _ in taken:
            reporter.sent(error if reporter.listening else None)


_senders: dict[tuple[int, str, int], ProgressSender] = {}
_senders_lock = threading.Lock()


def sender_for(settings: Settings) -> ProgressSender:
    """This process's sender to the broker of ``settings`` (made on first use, so never
    before a prefork child is forked)."""
    url = redis_url_from(settings.broker_url, settings.sentinel_master)
    key = (os.getpid(), url, settings.record_ttl_s)
    with _senders_lock:
        sender = _senders.get(key)
        if sender is None:
            sender = _senders[key] = ProgressSender(url, settings.record_ttl_s)
        return sender
