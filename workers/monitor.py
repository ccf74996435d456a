"""Task events only while a monitor watches: the lease behind ``enable_events``.

Celery's task events (task-sent/received/started/succeeded/failed) cost a Redis PUBLISH each,
four or five per call, whether or not anyone listens. With ``TOOLFLEET_TASK_EVENTS=monitor``
(the default) workers start with task events off. A monitor turns them on the way Celery
monitors always have: by broadcasting ``enable_events`` (Flower does it every 5 s, ``toolfleet
flower`` also once at start, ``celery control enable_events`` by hand). Each broadcast renews a
*lease* of ``TOOLFLEET_MONITOR_LEASE_S``; when no monitor renews it in time, the worker turns
its task events off again.

Dispatchers learn about the monitor from the workers: a worker holding a lease records it in
the hash ``Keys.monitor()`` (hostname → lease expiry, epoch seconds), and the dispatcher sends
task-sent events only while some lease there is live (:func:`is_watched`, re-read at most once
a second: :class:`toolfleet.broker.liveness.MonitorWatch`, which the dispatcher's direct
publishing path asks too). ``TOOLFLEET_TASK_EVENTS=always`` keeps every event on, as plain
Celery with ``-E``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from celery import Celery

from toolfleet.broker import liveness
from toolfleet.broker.liveness import WATCH_CACHE_S
from toolfleet.broker.redis_url import sync_client
from toolfleet.schemas.keys import Keys
from toolfleet.workers.app_info import monitor_watch_of, redis_url_of, settings_of
from toolfleet.workers.celery_internals import every, task_events_off

__all__ = [
    "CHECK_EVERY_S",
    "WATCH_CACHE_S",
    "MonitorLease",
    "is_watched",
    "live_leases",
    "monitor_key",
    "renew_lease",
]

log = logging.getLogger(__name__)

# How often a worker holding a lease checks whether it lapsed.
CHECK_EVERY_S = 1.0


def monitor_key(app: Celery) -> str:
    """The hash of live monitor leases for ``app``'s fleet (hostname → expiry, epoch s)."""
    return Keys(settings_of(app).key_prefix).monitor()


def _redis_for(app: Celery) -> redis.Redis:
    client: redis.Redis | None = getattr(app, "toolfleet_monitor_redis", None)
    if client is None:
        client = sync_client(redis_url_of(app), socket_timeout=5.0)
        app.toolfleet_monitor_redis = client
    return client


class MonitorLease:
    """One worker's task-event lease: renewed by ``enable_events``, lapses after ``lease_s``."""

    def __init__(self, consumer: Any, lease_s: float) -> None:
        self.consumer = consumer
        self.lease_s = lease_s
        self.expires_at = 0.0  # time.monotonic()
        self._timer_started = False

    def renew(self) -> None:
        self.expires_at = time.monotonic() + self.lease_s
        self._publish()
        if not self._timer_started:
            # The consumer's timer runs in the worker's main process, where events are sent.
            every(self.consumer, CHECK_EVERY_S, self.check)
            self._timer_started = True

    def check(self) -> None:
        """Turn task events off once the lease lapsed (the monitor left or stopped renewing)."""
        if time.monotonic() < self.expires_at:
            return
        if task_events_off(self.consumer):
            log.info(
                "No monitor renewed the task-event lease within %gs: task events off "
                "(TOOLFLEET_TASK_EVENTS=always keeps them on)",
                self.lease_s,
            )
            self._retract()

    def _publish(self) -> None:
        app = self.consumer.app
        key = monitor_key(app)
        expires_at = time.time() + self.lease_s
        try:
            pipe = _redis_for(app).pipeline(transaction=True)
            pipe.hset(key, self.consumer.hostname, repr(expires_at))
            pipe.expire(key, max(1, int(self.lease_s) + 1))
            pipe.execute()
        except (redis.RedisError, OSError) as exc:
            # The worker's own events are on regardless; only dispatchers' task-sent waits.
            log.warning("could not record the monitor lease in Redis: %s", exc)

    def _retract(self) -> None:
        app = self.consumer.app
        try:
            _redis_for(app).hdel(monitor_key(app), self.consumer.hostname)
        except (redis.RedisError, OSError) as exc:
            log.warning("could not remove the monitor lease from Redis: %s", exc)


def _toolfleet_settings(consumer: Any) -> Any:
    return getattr(getattr(consumer, "app", None), "toolfleet_settings", None)


def renew_lease(consumer: Any) -> None:
    """After Celery's ``enable_events`` ran: take or renew this worker's lease (the hook a
    starting worker installs, toolfleet.workers.celery_internals.patch_worker)."""
    settings = _toolfleet_settings(consumer)
    if settings is None or settings.task_events != "monitor":
        return  # another app's worker, or events always on: Celery's behaviour
    lease: MonitorLease | None = getattr(consumer, "toolfleet_lease", None)
    if lease is None:
        lease = consumer.toolfleet_lease = MonitorLease(consumer, settings.monitor_lease_s)
    lease.renew()


def live_leases(client: redis.Redis, key: str, now_s: float | None = None) -> dict[str, float]:
    """Worker hostname → lease expiry (epoch s) of every lease still live in ``key``."""
    return liveness.live_leases(client.hgetall(key), now_s)


def is_watched(app: Celery) -> bool:
    """Whether a monitor watches ``app``'s fleet now (dispatcher side, cached WATCH_CACHE_S
    by the app's :class:`~toolfleet.broker.liveness.MonitorWatch`)."""
    watch = monitor_watch_of(app)
    if watch is None:
        return True  # not a toolfleet app: Celery's behaviour, every event sent
    try:
        return watch.read(_redis_for(app))
    except (redis.RedisError, OSError):
        # The publish that follows will report the broker; without it, send the event.
        return watch.remember(True)
