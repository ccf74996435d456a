"""The one explicit Celery app, built from :class:`Settings`.

``celery -A toolfleet.workers.app worker -Q toolfleet.sync`` works as a Celery user expects: the
module builds ``app`` from the ``TOOLFLEET_*`` environment; with ``TOOLFLEET_BROKER_URL`` unset it
falls back to ``redis://127.0.0.1:6379/0`` (a local Redis), because a Celery worker cannot start the
embedded default by itself. ``toolfleet worker`` is the friendlier front end.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from toolfleet.broker.liveness import MonitorWatch
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.sentinel_url import is_sentinel
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.tasks import EXECUTE_TASK
from toolfleet.workers.app_info import DEFAULT_BROKER_URL, redis_url_of, registry_of, settings_of
from toolfleet.workers.app_signals import connect as connect_signal
from toolfleet.workers.app_signals import detach
from toolfleet.workers.bundle import register_execute_many_task
from toolfleet.workers.celery_internals import patch_worker, shadow_named_amqp
from toolfleet.workers.guard import keep_only_toolfleet_tasks
from toolfleet.workers.monitor import is_watched, renew_lease
from toolfleet.workers.prefork_task import register_execute_task
from toolfleet.workers.presence import register_presence
from toolfleet.workers.registry import Registry, registry
from toolfleet.workers.tool_catalog import register_tool_catalog

__all__ = [
    "DEFAULT_BROKER_URL",
    "EXECUTE_TASK",
    "ToolfleetCelery",
    "create_app",
    "redis_url_of",
    "registry_of",
    "settings_of",
]

# Names the task-sent event tool:<function> (C10), sent only while a monitor watches.
_AMQP = shadow_named_amqp(is_watched)


class ToolfleetCelery(Celery):
    """A Celery app whose toolfleet signal handlers go when it is closed (or collected)."""

    def close(self) -> None:
        detach(self)
        super().close()


def create_app(settings: Settings, *, registry: Registry = registry) -> Celery:
    """A new Celery app for ``settings``; each call returns an independent app.

    Creating it changes nothing in Celery or kombu themselves: what a worker patches, it
    patches when it starts (``worker_init``, :func:`_patch_at_worker_start`)."""
    broker_url = settings.broker_url or DEFAULT_BROKER_URL
    app = ToolfleetCelery("toolfleet", set_as_current=False, amqp=_AMQP)
    app.conf.update(
        broker_url=broker_url,
        broker_connection_retry_on_startup=True,
        result_backend=settings.result_backend,
        # No backend: Celery keeps nothing; the record under Keys.event(call_id) is the result.
        task_ignore_result=settings.result_backend is None,
        # Not extended: it would store the raw args (secrets included) next to the result.
        result_extended=False,
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        # "monitor": off until a monitor's enable_events lease turns them on
        # (toolfleet.workers.monitor).
        worker_send_task_events=settings.task_events == "always",
        task_send_sent_event=True,  # gated per message by _AMQP
        task_track_started=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=settings.sync_prefetch,
        broker_transport_options=_transport_options(settings),
        result_backend_transport_options=_backend_transport_options(settings),
        task_default_queue=settings.sync_queue,
        # Each queue on its own direct exchange: a bare Queue(name) would be bound to the
        # default exchange with the default routing key, so every call would reach both.
        task_queues=(_queue(settings.sync_queue), _queue(settings.async_queue)),
        task_routes={EXECUTE_TASK: {"queue": settings.sync_queue}},
    )
    app.toolfleet_settings = settings
    app.toolfleet_registry = registry
    # Whether a monitor watches: one cached answer for both of a dispatcher's publishing paths.
    app.toolfleet_monitor_watch = MonitorWatch(
        Keys(settings.key_prefix).monitor(), always=settings.task_events == "always"
    )

    _patch_at_worker_start(app)
    register_execute_task(app)
    register_execute_many_task(app)  # opt-in batching
    _load_tools_at_worker_start(app)
    register_presence(app)  # so a dispatcher can tell "no worker serves this queue"
    register_tool_catalog(app)  # what a dispatcher without a tool may show
    return app


def _backend_transport_options(settings: Settings) -> dict[str, Any]:
    options: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout_s}
    if is_sentinel(settings.result_backend):
        # Celery's sentinel:// result backend asks the sentinels for this primary.
        options["master_name"] = settings.sentinel_master
    return options


def _transport_options(settings: Settings) -> dict[str, Any]:
    # kombu sweeps unacked messages back to their queue only every interval x throttle
    # seconds (100 s by default); scale the sweep to the visibility timeout instead, so a
    # short timeout (tests, short tools) redelivers a dead worker's calls promptly.
    options: dict[str, Any] = {
        "visibility_timeout": settings.visibility_timeout_s,
        "unacked_restore_interval": max(1.0, min(10.0, settings.visibility_timeout_s / 2)),
        "unacked_restore_throttle": 1,
        # The sweep holds a Redis lock; a worker SIGKILLed while holding it blocks every
        # other worker's sweep until it expires (kombu: 300 s), so a dead worker's calls
        # waited 5 minutes (bench/chaos.py). Scale it to the visibility timeout
        # too: a sweep takes milliseconds, and two overlapping sweeps at worst deliver a call
        # twice, which its call_id record makes a no-op (C7).
        "unacked_mutex_expire": max(5, min(300, int(settings.visibility_timeout_s / 2))),
    }
    if is_sentinel(settings.broker_url):
        # kombu's SentinelChannel asks the sentinels of the URL for this primary, before
        # each new connection: a failover is followed by reconnecting.
        options["master_name"] = settings.sentinel_master
    return options


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def _patch_at_worker_start(app: Celery) -> None:
    def patch(sender: Any = None, **_: Any) -> None:
        # In the worker's own process, before its consumer starts: enable_events renews the
        # monitor lease, and a broker restart does not make the worker exit.
        patch_worker(on_enable=renew_lease)

    connect_signal(app, signals.worker_init, patch)


def _load_tools_at_worker_start(app: Celery) -> None:
    def load(sender: Any = None, **_: Any) -> None:
        # `celery -A toolfleet.workers.app worker` next to mytools.py: Celery imports the app from
        # the working directory but does not leave it on sys.path, so the tool modules
        # would not import (the README's plain-Celery recipe).
        try:
            registry_of(app).load_modules(settings_of(app).tools, search_dir=os.getcwd())
            registry_of(app).in_worker = True  # its errors now speak of a worker's registry
        except ConfigurationError as exc:
            # Celery logs and swallows a signal handler's Exception, which would leave a
            # worker that fails every call UnknownToolError: stop it with one line.
            print(f"toolfleet worker: configuration error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        # Operator safety: Celery's built-ins (celery.accumulate, ...) must not run by name.
        keep_only_toolfleet_tasks(app)

    connect_signal(app, signals.worker_init, load)


_default_app: Celery | None = None


def __getattr__(name: str) -> Any:
    # ``app`` is built on first access, not at import: importing this module (as the
    # dispatcher does) must not read the environment or create an app.
    # ``celery -A toolfleet.workers.app`` reads ``toolfleet.workers.app.app`` and so gets it.
    global _default_app
    if name == "app":
        if _default_app is None:
            _default_app = create_app(Settings.from_env())
        return _default_app
    raise AttributeError(f"module 'toolfleet.workers.app' has no attribute {name!r}")
