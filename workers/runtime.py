"""A worker process's state for one app, and what a call needs of it: :class:`CallRuntime`
and its :class:`CallStore`.

:class:`WorkerRuntime` is the real thing: the registry, the Redis stores, the heartbeat thread,
the prefork child's event loop. :func:`toolfleet.workers.call_runner.execute_async` asks only for a
:class:`CallRuntime`, which the batch path provides with its own store
(:class:`toolfleet.workers.bundle_store.BundleRuntime`).
"""

from __future__ import annotations

import asyncio
import os
from typing import Protocol

from celery import Celery

from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.wire import CallResult
from toolfleet.workers.app_info import redis_url_of, registry_of, settings_of
from toolfleet.workers.registry import Registry
from toolfleet.workers.store import AsyncRecordStore, Heartbeat, StartedMarker, SyncRecordStore

__all__ = ["CallRuntime", "CallStore", "WorkerRuntime", "runtime_for"]


class CallStore(Protocol):
    """The Redis operations one call makes from start to record (C7). The single-call
    :class:`toolfleet.workers.store.AsyncRecordStore` does them one call at a time, the batch's
    :class:`toolfleet.workers.bundle_store.BundleStore` for a whole batch at once."""

    async def terminal(self, call_id: str) -> CallResult | None:
        """The terminal record of ``call_id``, if any."""

    async def begin(
        self, call_id: str, marker: StartedMarker
    ) -> tuple[CallResult | None, StartedMarker | None]:
        """``(stored record, None)`` when this attempt (or a later one) already finished;
        ``(None, None)`` when ``marker`` now holds the call; ``(None, holder)`` when another
        delivery holds it."""

    async def started(self, call_id: str) -> StartedMarker | None:
        """The started marker of ``call_id``, if any."""

    async def take_over(self, call_id: str, marker: StartedMarker) -> StartedMarker | None:
        """Replace a stale marker with ``marker``; the live holder instead, if one took over."""

    async def finish(self, result: CallResult, reply_to: str | None) -> bool:
        """Store the terminal record, drop the marker, notify ``reply_to``; False when a
        record of this or a later attempt was there first (nothing changed)."""

    async def notify(self, result: CallResult, reply_to: str | None) -> None:
        """Push an already stored record to ``reply_to`` again."""

    async def keep_late(self, result: CallResult) -> None:
        """Keep the record of a run that ended after the dispatcher stopped its call."""


class CallRuntime(Protocol):
    """What running one call needs from its worker: the tools, where records go, the
    heartbeat that keeps its started marker fresh."""

    @property
    def registry(self) -> Registry: ...

    @property
    def heartbeat(self) -> Heartbeat: ...

    @property
    def keys(self) -> Keys: ...

    @property
    def settings(self) -> Settings: ...

    def async_store(self) -> CallStore:
        """The store this call's records go through, bound to the running loop."""
        ...


class WorkerRuntime:
    """Per-process worker state for one app: registry, Redis stores, heartbeat thread."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.settings = settings_of(app)
        self.registry: Registry = registry_of(app)
        self.keys = Keys(self.settings.key_prefix)
        self.redis_url = redis_url_of(app)
        self.pid = os.getpid()
        self.sync_store = SyncRecordStore.from_url(
            self.redis_url,
            self.keys,
            record_ttl_s=self.settings.record_ttl_s,
            replica_acks=self.settings.replica_acks,
        )
        self.heartbeat = Heartbeat(self.sync_store)
        self._async_stores: dict[int, AsyncRecordStore] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def async_store(self) -> AsyncRecordStore:
        """The asyncio store bound to the running loop (a client cannot cross loops)."""
        loop = asyncio.get_running_loop()
        store = self._async_stores.get(id(loop))
        if store is None:
            store = AsyncRecordStore.from_url(
                self.redis_url,
                self.keys,
                record_ttl_s=self.settings.record_ttl_s,
                outage_limit_s=self.settings.outage_limit_s,
                replica_acks=self.settings.replica_acks,
            )
            self._async_stores[id(loop)] = store
        return store

    def discard_loop(self) -> None:
        """Forget a loop left mid-task by an interrupt; the next call gets a fresh one."""
        self._loop = None
        self._async_stores.clear()

    def process_loop(self) -> asyncio.AbstractEventLoop:
        """The prefork child's event loop, reused across calls (not asyncio.run per call)."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop


def runtime_for(app: Celery) -> WorkerRuntime:
    """This process's runtime for ``app``; a forked child builds its own (no shared sockets)."""
    # Kept on the app, not in a module dict keyed by id(app): the runtime goes with its app,
    # and a later app that reuses the id never gets a dead app's runtime.
    runtimes: dict[int, WorkerRuntime] = app.__dict__.setdefault("toolfleet_runtimes", {})
    runtime = runtimes.get(os.getpid())
    if runtime is None:
        runtime = runtimes[os.getpid()] = WorkerRuntime(app)
    return runtime
