"""One background task per Fleet that receives every call result pushed by the workers.

Workers RPUSH each CallResult onto this collector's reply list; the collector BLPOPs it on
its own connection and resolves the future waiting for that (call_id, attempt). Nothing
polls per task and the caller's event loop is never blocked.

The reply list is only the fast path. A pop whose answer is lost in transit (a socket
timeout after the server already removed the replies) would strand its calls, so after any
connection error, and every few idle seconds while calls are awaited, the collector reads
the awaited calls' durable records (``Keys.event``) and delivers those that have finished.

That fallback must stay rare: a socket timeout also drops whatever the server had popped for
it. redis-py's default 5 s read timeout counts event-loop time, so a loop kept busy by the
tasks of a large batched window (thousands of results resolved at once) timed out a BLMPOP
whose answer was already in the socket buffer, and the window waited on the slow record
reads (700 results recovered mid-batch in a bench run). The collector's connection
therefore reads with a timeout far above any loop stall, and finds a dead broker through TCP
keepalive instead, which the kernel runs whatever the loop is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from typing import cast

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import RedisError, ResponseError

from toolfleet.broker.redis_url import async_client
from toolfleet.dispatcher.infra.outage_log import outage_log
from toolfleet.dispatcher.infra.stopping import cancel_and_wait, raise_if_cancelled
from toolfleet.schemas.progress import ProgressReport, decode, is_progress
from toolfleet.schemas.wire import CallResult

__all__ = ["Collector", "connect"]

log = logging.getLogger(__name__)

# BLPOP wakes this often with nothing to do, so close() never waits long.
_BLOCK_S = 1.0
# After a wake-up, take up to this many more results in one round trip.
_DRAIN_COUNT = 1000
_RECONNECT_DELAY_S = 0.5
# While calls are awaited and no reply arrives, re-read their records this often.
_RECOVER_EVERY_S = 5.0
_RECOVER_CHUNK = 500
# A read of a BLMPOP (answered by the server within _BLOCK_S) fails only past this much
# loop time; a busy loop is not a dead broker. Keepalive finds a dead one in ~11 s.
_READ_TIMEOUT_S = 60.0
_KEEPALIVE_IDLE_S = 5
_KEEPALIVE_INTERVAL_S = 2
_KEEPALIVE_PROBES = 3


def connect(redis_url: str) -> aioredis.Redis:
    """A dispatcher client (the collector's, and the loop's history/publishing and reconciler
    clients): a long read timeout, dead peers found by TCP keepalive."""
    options: dict[int, int] = {}
    # Linux names; elsewhere the kernel's keepalive defaults apply.
    for name, value in (
        ("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", _KEEPALIVE_PROBES),
    ):
        if hasattr(socket, name):
            options[getattr(socket, name)] = value
    if redis_url.startswith("unix:"):
        # A Unix socket has no keepalive (redis-py refuses the option): a dead server is a
        # reset connection at once.
        return async_client(redis_url, socket_timeout=_READ_TIMEOUT_S, socket_connect_timeout=5.0)
    return async_client(
        redis_url,
        socket_timeout=_READ_TIMEOUT_S,
        socket_connect_timeout=5.0,
        socket_keepalive=True,
        socket_keepalive_options=options,
    )


class Collector:
    """Resolves one future per expected (call_id, attempt) from the reply list."""

    def __init__(
        self, client: aioredis.Redis, reply_key: str, event_key: Callable[[str], str]
    ) -> None:
        self.client = client
        self.reply_key = reply_key
        self.event_key = event_key
        self._pending: dict[tuple[str, int], asyncio.Future[CallResult]] = {}
        # call_id -> who gets its progress reports (toolfleet.dispatcher.batch.progress_relay).
        self._listeners: dict[str, Callable[[ProgressReport], None]] = {}
        self._task: asyncio.Task[None] | None = None
        # None until the server has shown whether it knows BLMPOP (Redis >= 7).
        self._multipop: bool | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"toolfleet-collector:{self.reply_key}"
            )

    def expect(self, call_id: str, attempt: int) -> asyncio.Future[CallResult]:
        """The future for one attempt's result; register it before publishing the call."""
        key = (call_id, attempt)
        future = self._pending.get(key)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._pending[key] = future
        return future

    def forget(self, call_id: str, attempt: int) -> None:
        """Stop waiting for an attempt (it was never published, or the caller gave up)."""
        future = self._pending.pop((call_id, attempt), None)
        if future is not None and not future.done():
            future.cancel()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def awaited(self) -> list[tuple[str, int]]:
        """The (call_id, attempt) pairs still waiting for a result."""
        return [key for key, future in self._pending.items() if not future.done()]

    def is_awaited(self, call_id: str, attempt: int) -> bool:
        future = self._pending.get((call_id, attempt))
        return future is not None and not future.done()

    def fail(self, call_id: str, attempt: int, error: BaseException) -> None:
        """End the wait for one attempt with ``error`` (its result can no longer arrive)."""
        future = self._pending.pop((call_id, attempt), None)
        if future is not None and not future.done():
            future.set_exception(error)

    def listen(self, call_id: str, listener: Callable[[ProgressReport], None]) -> None:
        """Hand ``call_id``'s progress reports to ``listener`` until :meth:`unlisten`."""
        self._listeners[call_id] = listener

    def unlisten(self, call_id: str) -> None:
        self._listeners.pop(call_id, None)

    def deliver(self, raw: bytes | str) -> None:
        """Resolve the future a raw CallResult belongs to; ignore duplicates and strangers.
        A progress report goes to its call's listener instead (:meth:`listen`)."""
        if is_progress(raw):
            self._progress(raw)
            return
        try:
            result = CallResult.model_validate_json(raw)
        except ValidationError as exc:
            log.error("collector %s: unreadable reply dropped: %s", self.reply_key, exc)
            return
        future = self._pending.pop((result.call_id, result.attempt), None)
        if future is not None and not future.done():
            future.set_result(result)

    def _progress(self, raw: bytes | str) -> None:
        """A report reaches its listener only while its attempt is awaited: one of a call
        this collector no longer knows (finished, given up on, or sent by a dispatcher that
        has since restarted) is dropped, as is one it cannot read."""
        report = decode(raw)
        if report is None:
            log.debug("collector %s: unreadable progress report dropped", self.reply_key)
            return
        listener = self._listeners.get(report.call_id)
        if listener is None or not self.is_awaited(report.call_id, report.attempt):
            return
        try:
            listener(report)
        except Exception:  # the relay only queues; never let it stop the results
            log.exception("collector %s: progress listener failed", self.reply_key)

    async def _pop(self) -> list[bytes]:
        """Wait up to _BLOCK_S for replies; return every one available, in one round trip
        on Redis >= 7 (BLMPOP), in two on older servers (BLPOP, then LPOP the rest)."""
        if self._multipop is not False:
            try:
                popped = await self.client.blmpop(
                    _BLOCK_S, 1, self.reply_key, direction="LEFT", count=_DRAIN_COUNT
                )
            except ResponseError as exc:
                if self._multipop or "unknown command" not in str(exc).lower():
                    raise
                self._multipop = False
            else:
                self._multipop = True
                return [] if popped is None else cast(list[bytes], popped[1])
        first = await self.client.blpop([self.reply_key], timeout=_BLOCK_S)
        if first is None:
            return []
        more = await self.client.lpop(self.reply_key, _DRAIN_COUNT)
        return [cast(bytes, first[1]), *cast(list[bytes], more or [])]

    async def _run(self) -> None:
        last_reply_s = time.monotonic()
        outage = outage_log(self.client)
        failed = False
        while True:
            raise_if_cancelled()  # recover() below may have caught the cancel itself
            try:
                replies = await self._pop()
                if failed:
                    failed = False
                    outage.answering(f"collector {self.reply_key}")
                for raw in replies:
                    self.deliver(raw)
                if replies:
                    last_reply_s = time.monotonic()
                elif self._pending and time.monotonic() - last_reply_s > _RECOVER_EVERY_S:
                    await self.recover()
                    last_reply_s = time.monotonic()
            except (RedisError, OSError) as exc:
                raise_if_cancelled()
                failed = True
                outage.failing(f"collector {self.reply_key}", exc, waiting=len(self._pending))
                await asyncio.sleep(_RECONNECT_DELAY_S)
                with contextlib.suppress(RedisError, OSError):
                    await self.recover()
            except Exception:
                raise_if_cancelled()
                log.exception("collector %s: unexpected error; continuing", self.reply_key)
                await asyncio.sleep(_RECONNECT_DELAY_S)

    async def recover(self) -> int:
        """Deliver every awaited attempt whose record is already stored; return how many."""
        awaited = self.awaited()
        delivered = 0
        for start in range(0, len(awaited), _RECOVER_CHUNK):
            chunk = awaited[start : start + _RECOVER_CHUNK]
            raws = await self.client.mget([self.event_key(call_id) for call_id, _ in chunk])
            for (call_id, attempt), raw in zip(chunk, raws, strict=True):
                if raw is None:
                    continue
                try:
                    result = CallResult.model_validate_json(raw)
                except ValidationError:
                    continue
                # The record holds the latest attempt; an older one is not this wait's answer.
                if result.attempt == attempt and self.is_awaited(call_id, attempt):
                    self.deliver(raw)
                    delivered += 1
        if delivered:
            log.warning(
                "collector %s: recovered %d result(s) from stored records",
                self.reply_key,
                delivered,
            )
        return delivered

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        for future in self._pending.values():
            if not future.done():
                future.cancel()
        self._pending.clear()
        self._listeners.clear()
        await self.client.aclose()
