"""The caller's handle on a fleet: Celery app, tool registry, Redis client and collector."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis.asyncio as aioredis
from celery import Celery

from dispatcher.broker_watch import BrokerWatch
from dispatcher.collector import Collector
from dispatcher.reconciler import Reconciler
from schemas.errors import BrokerError
from schemas.keys import Keys
from schemas.settings import Settings
from schemas.tool import Tool
from schemas.wire import CallMessage, CallResult
from workers.app import create_app, redis_url_of
from workers.registry import Registry
from workers.registry import registry as default_registry

__all__ = ["Fleet", "default_fleet"]

log = logging.getLogger(__name__)


class Fleet:
    """Everything a dispatcher needs to send calls to the workers and hear back.

    The tools named in ``settings.tools`` are imported into ``registry`` (the default
    registry unless given): the dispatcher validates arguments, redacts secrets and picks
    each call's queue from the tool registered under its name.

    Redis clients and the collector belong to one event loop; they are created on first use
    inside a running loop and re-created if the fleet is later used from another loop.
    Call :meth:`aclose` when done.
    """

    def __init__(self, settings: Settings | None = None, *, registry: Registry | None = None):
        self.settings = settings if settings is not None else Settings.from_env()
        self.registry = registry if registry is not None else default_registry
        self.registry.load_modules(self.settings.tools)
        self.keys = Keys(self.settings.key_prefix)
        self.app: Celery = create_app(self.settings, registry=self.registry)
        self.redis_url = redis_url_of(self.app)
        self.collector_id = uuid.uuid4().hex
        self.reply_key = self.keys.reply(self.collector_id)
        # kombu producers are not thread-safe: one publishing thread per fleet.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolfleet-publish")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._redis: aioredis.Redis | None = None
        self._collector: Collector | None = None
        self._watch: BrokerWatch | None = None
        self._reconciler: Reconciler | None = None

    @classmethod
    def from_env(cls, *, registry: Registry | None = None, **overrides: Any) -> Fleet:
        """A fleet for ``TOOLFLEET_*`` settings; keyword overrides win over the environment."""
        return cls(Settings.from_env(**overrides), registry=registry)

    def tool(self, function: str) -> Tool:
        """The registered tool named ``function``; UnknownToolError if there is none."""
        return self.registry.get(function)

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._redis is not None:
            return
        # A previous loop's clients cannot be awaited from here; drop them.
        self._loop = loop
        self._redis = aioredis.Redis.from_url(self.redis_url)
        self._collector = Collector(
            aioredis.Redis.from_url(self.redis_url), self.reply_key, self.keys.event
        )
        self._collector.start()
        # Issue 7: a broker restart or long outage must not leave calls awaited forever.
        self._watch = BrokerWatch(
            aioredis.Redis.from_url(self.redis_url),
            self._collector,
            self.keys,
            self.redis_url,
            pools=[self._redis.connection_pool],
            outage_limit_s=self.settings.outage_limit_s,
        )
        self._watch.start()
        # Issue 12: a queue with no worker, or a message the broker lost, must not leave a
        # call awaited forever.
        self._reconciler = Reconciler(
            aioredis.Redis.from_url(self.redis_url),
            self._collector,
            self.keys,
            self.settings,
            self._publish_raw,
            self.collector_id,
        )
        self._reconciler.start()

    @property
    def redis(self) -> aioredis.Redis:
        """The asyncio Redis client for history and records, bound to the running loop."""
        self._bind()
        assert self._redis is not None
        return self._redis

    @property
    def collector(self) -> Collector:
        self._bind()
        assert self._collector is not None
        return self._collector

    @property
    def reconciler(self) -> Reconciler:
        self._bind()
        assert self._reconciler is not None
        return self._reconciler

    def expect(self, call_id: str, attempt: int) -> asyncio.Future[CallResult]:
        return self.collector.expect(call_id, attempt)

    async def publish(
        self, calls: Sequence[tuple[CallMessage, Tool]], *, batch_size: int | None = None
    ) -> None:
        """Enqueue ``calls`` in one hop to the publishing thread; raises BrokerError.

        With ``batch_size``, up to that many calls share one ``toolfleet.execute_many``
        message (CallParams.batch_size); otherwise each call is its own task. The reconciler
        tracks each call from here until its result arrives.
        """
        await self._publish_raw(calls, batch_size=batch_size)
        await self.reconciler.published(calls)

    async def _publish_raw(
        self, calls: Sequence[tuple[CallMessage, Tool]], *, batch_size: int | None = None
    ) -> None:
        from dispatcher.enqueue import publish_calls
        from workers.batch import publish_batched

        if not calls:
            return
        loop = asyncio.get_running_loop()
        try:
            if batch_size is None:
                await loop.run_in_executor(self._executor, publish_calls, self.app, list(calls))
            else:
                await loop.run_in_executor(
                    self._executor, publish_batched, self.app, list(calls), batch_size
                )
        except BrokerError:
            raise
        except Exception as exc:
            raise BrokerError(
                f"could not enqueue {len(calls)} call(s) on {self.settings.broker_url!r}: "
                f"{type(exc).__name__}: {exc}; check that the broker is running"
            ) from exc

    async def aclose(self) -> None:
        """Stop the collector and close the Redis clients (of the current loop)."""
        collector, self._collector = self._collector, None
        reconciler, self._reconciler = self._reconciler, None
        client, self._redis = self._redis, None
        watch, self._watch = self._watch, None
        same_loop = self._loop is asyncio.get_running_loop()
        self._loop = None
        if same_loop:
            if reconciler is not None:
                await reconciler.aclose()
            if watch is not None:
                await watch.aclose()
            if collector is not None:
                await collector.aclose()
            if client is not None:
                await client.aclose()
        self._executor.shutdown(wait=False)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolfleet-publish")

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


_default: Fleet | None = None


def default_fleet() -> Fleet:
    """The process-default fleet, ``Fleet.from_env()``, created on first use."""
    global _default
    if _default is None:
        _default = Fleet.from_env()
    return _default
