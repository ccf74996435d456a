"""The store one bundle's calls share: the C7 start of every call in one round trip, every record
and reply in one more.

:class:`BundleStore` is a :class:`toolfleet.workers.runtime.CallStore`, so each call of a bundle
goes through :func:`toolfleet.workers.call_runner.execute_async` unchanged. It speaks the
single-call store's protocol, only pipelined: :meth:`BundleStore.prefetch` starts every call
whose tool is registered with the same commands (:func:`toolfleet.workers.store.queue_begin`,
read by :func:`toolfleet.workers.store.read_begin`) and reads the record of every other one;
:meth:`BundleStore.flush` writes every record with the same FINISH
(:mod:`toolfleet.workers.record_scripts`) and every repeated reply. Anything off that path (a
live duplicate, a lost holder) goes to the real store, so the C7 and worker-lost rules hold as
for a single call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.wire import CallMessage, CallResult
from toolfleet.workers.record_scripts import FINISH, finish_call
from toolfleet.workers.registry import Registry
from toolfleet.workers.runtime import WorkerRuntime
from toolfleet.workers.store import (
    AsyncRecordStore,
    Heartbeat,
    StartedMarker,
    StartFinding,
    queue_begin,
    read_begin,
)

__all__ = ["BundleRuntime", "BundleStore"]

# Redis connections one bundle may hold at once for calls off the prefetched happy path.
_SLOW_PATH_CONNECTIONS = 8

_Begun = tuple[CallResult | None, StartedMarker | None]


class BundleStore:
    """A :class:`toolfleet.workers.store.CallStore` answering each call's start from one pipelined
    prefetch and buffering its record until :meth:`flush`."""

    def __init__(self, store: AsyncRecordStore, hostname: str) -> None:
        self.store = store
        # The worker's client, for what a call does besides its record (its limits).
        self.client = store.client
        self.hostname = hostname
        # Per call id, in order (a bundle may hold one call id twice): prefetched answers.
        self._begun: dict[str, list[tuple[StartFinding, StartedMarker]]] = {}
        self._terminal: dict[str, list[CallResult | None]] = {}
        self._writes: list[tuple[CallResult, str | None, bool]] = []
        # The client's pool has a connection cap shared by every bundle on the loop; a bundle
        # whose calls all take the slow path must not open one connection per call.
        self._slow_path = asyncio.Semaphore(_SLOW_PATH_CONNECTIONS)

    async def prefetch(self, messages: Sequence[CallMessage], registry: Registry) -> None:
        """In one round trip: the start (:func:`toolfleet.workers.store.queue_begin`) of each call
        execute_async would start (its tool is registered), the stored record of each other
        call (execute_async looks it up)."""
        if not messages:
            return
        keys, ttl_s, client = self.store.keys, self.store.record_ttl_s, self.store.client
        markers: list[StartedMarker | None] = []
        nx_get = await self.store.nx_get()
        async with client.pipeline(transaction=False) as pipe:
            for m in messages:
                if m.function in registry:
                    marker = StartedMarker.now(self.hostname, m.attempt)
                    queue_begin(pipe, keys, m.call_id, marker, ttl_s, nx_get=nx_get)
                    markers.append(marker)
                else:
                    pipe.get(keys.event(m.call_id))
                    markers.append(None)
            replies = iter(await pipe.execute())
        for m, mine in zip(messages, markers, strict=True):
            if mine is not None:
                previous, raw = next(replies), next(replies)
                begun = read_begin(previous, raw, mine)
                self._begun.setdefault(m.call_id, []).append((begun, mine))
            else:
                raw = next(replies)
                stored = None if raw is None else CallResult.model_validate_json(raw)
                self._terminal.setdefault(m.call_id, []).append(stored)

    async def terminal(self, call_id: str) -> CallResult | None:
        answers = self._terminal.get(call_id)
        if answers:
            return answers.pop(0)
        async with self._slow_path:
            return await self.store.terminal(call_id)

    async def begin(self, call_id: str, marker: StartedMarker) -> _Begun:
        answers = self._begun.get(call_id)
        if answers:
            begun, claimed_with = answers.pop(0)
            if begun.give_back:
                # Release the marker prefetch() set, not execute_async's: only ours is removed.
                async with self._slow_path:
                    await self.store.release(call_id, claimed_with)
            return begun.stored, begun.holder
        async with self._slow_path:
            return await self.store.begin(call_id, marker)

    async def started(self, call_id: str) -> StartedMarker | None:
        async with self._slow_path:
            return await self.store.started(call_id)

    async def take_over(self, call_id: str, marker: StartedMarker) -> StartedMarker | None:
        async with self._slow_path:
            return await self.store.take_over(call_id, marker)

    async def keep_late(self, result: CallResult) -> None:
        async with self._slow_path:
            await self.store.keep_late(result)

    async def finish(self, result: CallResult, reply_to: str | None) -> bool:
        # Applied at flush() with FINISH, as the real finish(); a record that loses
        # there (a revoke got in first) keeps the stored one in Redis and the reply list, and
        # only this bundle's summary count is optimistic.
        self._writes.append((result, reply_to, True))
        return True

    async def notify(self, result: CallResult, reply_to: str | None) -> None:
        self._writes.append((result, reply_to, False))

    async def flush(self) -> None:
        """Write every buffered record and reply in one round trip, each as finish() would."""
        writes, self._writes = self._writes, []
        if not writes:
            return
        keys, ttl_s, client = self.store.keys, self.store.record_ttl_s, self.store.client

        async def write() -> None:
            async with client.pipeline(transaction=False) as pipe:
                for result, reply_to, store_record in writes:
                    if store_record:
                        script_keys, args = finish_call(keys, result, reply_to, ttl_s)
                        await FINISH.run(pipe, keys=script_keys, args=args)
                    elif reply_to:
                        pipe.rpush(reply_to, result.model_dump_json())
                        pipe.expire(reply_to, ttl_s)
                await pipe.execute()

        if not self.store.replica_acks:
            await asyncio.shield(write())
            return
        # TOOLFLEET_REPLICA_ACKS: the whole pipeline again until the replicas have it (each
        # record's script keeps the first record; a reply pushed twice is read once).
        await asyncio.shield(self.store.through_outage(lambda: self.store.replicated(write())))


class BundleRuntime:
    """A :class:`toolfleet.workers.runtime.CallRuntime`: the worker's, with the bundle's store."""

    def __init__(self, runtime: WorkerRuntime, store: BundleStore) -> None:
        self.registry: Registry = runtime.registry
        self.heartbeat: Heartbeat = runtime.heartbeat
        self.keys: Keys = runtime.keys
        self.settings: Settings = runtime.settings
        self._store = store

    def async_store(self) -> BundleStore:
        return self._store
