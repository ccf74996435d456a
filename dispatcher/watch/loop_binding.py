"""One event loop's share of a Fleet: its Redis client, collector, broker watch, reconciler.

Redis asyncio clients and background tasks belong to the loop that made them, so a Fleet
keeps one LoopBinding per loop that uses it. Each binding has its own
dispatcher id and reply list: two loops using one fleet at once (two threads, say) never take
each other's results. A binding closes itself when its loop is shut down the standard way
(``asyncio.run``, ``asyncio.Runner``: both call ``loop.shutdown_asyncgens()``), because it
holds an async generator of that loop whose ``finally`` closes it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING

from toolfleet.dispatcher.history.durable import DurableLog
from toolfleet.dispatcher.watch.broker_watch import BrokerWatch
from toolfleet.dispatcher.watch.collector import Collector, connect
from toolfleet.dispatcher.watch.reconciler import Reconciler
from toolfleet.schemas.errors import InternalError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.redis_url import (
    async_client,
    check_sentinel_master,
    require_replica_acks,
)
from toolfleet.schemas.settings import Settings

if TYPE_CHECKING:
    Publish = Callable[..., Awaitable[None]]

__all__ = ["LoopBinding"]


class LoopBinding:
    """The clients and background tasks of one fleet on one running event loop."""

    def __init__(
        self,
        redis_url: str,
        keys: Keys,
        settings: Settings,
        publish: Publish,
        on_loop_end: Callable[[LoopBinding], Awaitable[None]],
        *,
        on_answer: Callable[[], None] | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        # A Sentinel URL: a primary name no sentinel monitors is a ConfigurationError here,
        # once per loop, not calls retried through an "outage" that never ends.
        check_sentinel_master(redis_url, timeout_s=1.0)
        self.dispatcher_id = uuid.uuid4().hex
        self.reply_key = keys.reply(self.dispatcher_id)
        # The history, journal and publishing client reads as the collector's does
        # (toolfleet.dispatcher.watch.collector.connect): redis-py's default 5 s read timeout counts
        # loop time, so a loop kept busy by a large window timed out replies already in the socket —
        # a history write retried, a publish sent twice. A dead broker is found by keepalive.
        self.redis = require_replica_acks(connect(redis_url), settings.replica_acks)
        self.collector = Collector(connect(redis_url), self.reply_key, keys.event)
        self.collector.start()
        # The histories of branches with a batch in flight on this loop (each with its count
        # of batches): a broker that restarts without its data gets them back from memory.
        self.histories: dict[DurableLog, int] = {}
        # A broker restart or long outage must not leave calls awaited forever.
        self.watch = BrokerWatch(
            # Keeps redis-py's 5 s read timeout: its probe is how a stalled broker (alive to
            # TCP keepalive, answering nothing) is noticed; a probe missed to a busy loop only
            # starts an outage that a later probe ends.
            async_client(redis_url),
            self.collector,
            keys,
            redis_url,
            pools=[self.redis.connection_pool],
            outage_limit_s=settings.outage_limit_s,
            queues=(settings.sync_queue, settings.async_queue),
            histories=lambda: list(self.histories),
            record_ttl_s=settings.record_ttl_s,
            on_answer=on_answer,
        )
        self.watch.start()
        # A queue with no worker, or a message the broker lost, must not leave a
        # call awaited forever.
        self.reconciler = Reconciler(
            connect(redis_url),
            self.collector,
            keys,
            settings,
            publish,
            self.dispatcher_id,
        )
        self.watch.on_restart = self.reconciler.broker_restarted
        self.reconciler.start()
        self._closed = False
        self._sentinel_ended = False
        # Started here, so the loop's asyncgen hooks register it; shutdown_asyncgens() then
        # runs its finally on this loop, before the loop closes.
        self._sentinel = _at_loop_end(self, on_loop_end)
        _advance_to_yield(self._sentinel)

    async def aclose(self) -> None:
        """Stop the background tasks and close the clients; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await self.reconciler.aclose()
        await self.watch.aclose()
        await self.collector.aclose()
        await self.redis.aclose()
        if not self._sentinel_ended:
            # Closed early (Fleet.aclose): the loop's shutdown has nothing left to do.
            await self._sentinel.aclose()


def _advance_to_yield(agen: AsyncGenerator[None, None]) -> None:
    """Run ``agen`` to its first ``yield`` now: ``__anext__`` calls the running loop's
    firstiter hook, which adds it to the loop's async generators; nothing before the yield
    awaits, so one step gets there."""
    step = agen.__anext__()
    try:
        step.send(None)
    except StopIteration:
        return
    raise InternalError("the loop-end sentinel awaited before its first yield")


async def _at_loop_end(
    binding: LoopBinding, on_loop_end: Callable[[LoopBinding], Awaitable[None]]
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        binding._sentinel_ended = True
        await on_loop_end(binding)
