"""Each worker says, in Redis, which queues it consumes: the dispatcher's "is anyone there?".

A worker's main process beats every ``PRESENCE_INTERVAL_S`` into one sorted set per queue
(``Keys.workers(queue)``: member = worker hostname, score = epoch seconds of the beat) and
removes itself on a warm shutdown. A worker killed outright stops beating; after
``PRESENCE_STALE_S`` it no longer counts. One ZCOUNT tells a dispatcher whether a queue it just
published to has a live consumer, without a broadcast to every worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from celery import Celery, signals

from toolfleet.broker.liveness import PRESENCE_STALE_S, live_since
from toolfleet.broker.redis_url import sync_client
from toolfleet.schemas.keys import Keys
from toolfleet.workers.app_info import redis_url_of, settings_of
from toolfleet.workers.app_signals import connect as connect_signal
from toolfleet.workers.celery_internals import consumed_queues

__all__ = ["PRESENCE_INTERVAL_S", "PRESENCE_STALE_S", "Presence", "live_since", "register_presence"]

log = logging.getLogger(__name__)

PRESENCE_INTERVAL_S = 2.0
# Beats older than this are removed from the set by the next beat of any worker.
_FORGET_S = 3600.0


class Presence:
    """One daemon thread per worker process beating its queues into Redis."""

    def __init__(self, client: redis.Redis, keys: Keys, hostname: str, queues: Iterable[str]):
        self.client = client
        self.keys = keys
        self.hostname = hostname
        self.queues = sorted(set(queues))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        now = time.time()
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            key = self.keys.workers(queue)
            pipe.zadd(key, {self.hostname: now})
            pipe.zremrangebyscore(key, "-inf", now - _FORGET_S)
            pipe.expire(key, int(_FORGET_S))
        pipe.execute()

    def start(self) -> None:
        try:
            self.beat()  # at once: a dispatcher waiting on this queue sees the worker now
        except redis.RedisError as exc:
            log.warning("worker %s: presence beat failed: %s", self.hostname, exc)
        self._thread = threading.Thread(target=self._run, name="toolfleet-presence", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        try:
            pipe = self.client.pipeline(transaction=False)
            for queue in self.queues:
                pipe.zrem(self.keys.workers(queue), self.hostname)
            pipe.execute()
        except redis.RedisError:
            pass  # the entry goes stale by itself
        self.client.close()

    def _run(self) -> None:
        while not self._stop.wait(PRESENCE_INTERVAL_S):
            try:
                self.beat()
            except redis.RedisError:
                continue  # the broker is down; the next beat will tell it again


def register_presence(app: Celery) -> None:
    """Beat the worker's queues into Redis from ``worker_ready`` to ``worker_shutdown``."""
    running: list[Presence] = []

    def start(sender: Any = None, **_: Any) -> None:
        presence = Presence(
            sync_client(redis_url_of(app), socket_timeout=5),
            Keys(settings_of(app).key_prefix),
            str(getattr(sender, "hostname", None) or "unknown"),
            consumed_queues(app),
        )
        presence.start()
        running.append(presence)

    def stop(sender: Any = None, **_: Any) -> None:
        while running:
            running.pop().stop()

    connect_signal(app, signals.worker_ready, start)
    connect_signal(app, signals.worker_shutdown, stop)
