"""Everything toolfleet does to Flower (and to Celery's event state inside it), in one place.

Written against Flower 2.2.0 on Celery 5.7.0. ``tests/unit/test_flower_internals.py`` checks every
internal used here against the installed Flower and Celery and fails naming what changed; when
it fails, fix the function here, nowhere else. The worker side's counterpart is
:mod:`toolfleet.workers.celery_internals`.

What for: Flower lists each call as ``tool:<function>`` under its call id with its own state
and runtime (C10), ``toolfleet flower`` runs Flower in-process on the workers' own app, and
Flower's queue lengths reach a Sentinel primary through any of the sentinels.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from typing import Any

from celery import Celery, states
from celery.events.state import Task

from toolfleet.schemas.redis_url import async_client, is_sentinel
from toolfleet.schemas.tasks import EXECUTE_TASK

__all__ = [
    "AWAITING_APPROVAL",
    "FLOWER_WRITTEN_AGAINST",
    "FUNCTION_IN_ARGSREPR",
    "FlowerServer",
    "ToolTask",
    "ask_every_sentinel",
    "track_calls",
]

FLOWER_WRITTEN_AGAINST = "2.2.0"

# What Flower shows for a call parked until someone approves it (docs/controls.md).
AWAITING_APPROVAL = "AWAITING_APPROVAL"

# toolfleet.dispatcher.send.enqueue shows a call as repr(({'call_id': ..., 'branch_id': ...,
# 'function': ...},)).
FUNCTION_IN_ARGSREPR = re.compile(r"'function': '([^'\\]+)'")


class ToolTask(Task):
    """Flower's record of one call; a late ``task-sent`` cannot rename it.

    The dispatcher's task-sent event and the worker's task-received event travel on different
    connections, so the received one can arrive first. Celery then merges every field of the
    logically earlier sent event, including its name, the real task name
    ``toolfleet.execute``, over the tool name the worker announced. Module level, so Flower's
    persistent state can pickle it.

    Internal: ``celery.events.state.Task.merge_rules`` (state → fields a late event may set).
    """

    merge_rules = {
        **Task.merge_rules,
        states.PENDING: ("args", "kwargs", "retries", "eta", "expires", "root_id", "parent_id"),
    }

    def event(
        self,
        type_: str,
        timestamp: float | None = None,
        local_received: float | None = None,
        fields: dict[str, Any] | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Celery's ``Task.event``, plus the dispatcher's ``approval`` field on ``task-sent``
        (toolfleet.dispatcher.watch.approval_events): ``"waiting"`` shows the call as
        ``AWAITING_APPROVAL``, any other value as ``REVOKED`` (it ended without running).

        Celery ranks a state it does not know above ``STARTED``, so a later event of the
        approved call could not move it on; it is ranked as ``PENDING`` instead.
        """
        approval = (fields or {}).get("approval") if type_ == "sent" else None
        if getattr(self, "state", None) == AWAITING_APPROVAL:
            self.state = states.PENDING
        super().event(type_, timestamp, local_received, fields, *args, **kwargs)
        if approval is None or getattr(self, "state", None) != states.PENDING:
            return
        if approval == "waiting":
            self.state = AWAITING_APPROVAL
        else:
            self.state = states.REVOKED
            self.revoked = timestamp


def track_calls(state: Any) -> None:
    """Adapt Flower's event state to calls: named ``tool:<function>``, runtime on failures too.

    Celery puts the real task name in task-sent events (the worker's events carry the shadow
    name), so a call still queued would show as ``toolfleet.execute`` and be counted under that
    name in ``/metrics``; its function is read back from the redacted argsrepr instead. Celery's
    task-failed event has no runtime, so a failed call's runtime is its started-to-failed time
    (both stamped by the worker); the Prometheus runtime histogram stays successes-only.

    Internal: ``celery.events.state.State`` builds tasks from its ``Task`` attribute and applies
    events in ``event(event)``; ``tasks`` maps uuid → Task with ``runtime``, ``started`` and
    ``failed`` (timestamps).
    """
    state.Task = ToolTask
    apply_event = state.event

    def event(event: dict[str, Any]) -> Any:
        if event.get("type") == "task-sent" and event.get("name") == EXECUTE_TASK:
            match = FUNCTION_IN_ARGSREPR.search(str(event.get("args") or ""))
            if match is not None:
                event = {**event, "name": f"tool:{match[1]}"}
        applied = apply_event(event)
        if event.get("type") == "task-failed":
            task = state.tasks.get(event.get("uuid"))
            if task is not None and task.runtime is None and task.started and task.failed:
                task.runtime = max(0.0, task.failed - task.started)
        return applied

    state.event = event


def ask_every_sentinel(redis_url: str) -> None:
    """Let Flower's Broker page and ``/api/queues/length`` find a Sentinel primary through
    every sentinel of ``redis_url`` (a URL naming its primary, toolfleet.schemas.redis_url).

    Flower builds its Sentinel client from the first URL of kombu's failover list alone, so
    while that one sentinel is down it shows no queue lengths (its API answers 500), though
    the others would name the primary. A no-op for any other URL.

    Internal: ``flower.utils.broker.RedisSentinel._get_redis_client(broker_options,
    broker_use_ssl)`` returns the asyncio client its ``queues()`` reads and closes; the
    instance carries ``socket_timeout`` and ``socket_connect_timeout``.
    """
    if not is_sentinel(redis_url):
        return
    from flower.utils import broker

    def primary(self: Any, broker_options: Any, broker_use_ssl: Any) -> Any:
        return async_client(
            redis_url,
            socket_timeout=self.socket_timeout,
            socket_connect_timeout=self.socket_connect_timeout,
        )

    broker.RedisSentinel._get_redis_client = primary


class FlowerServer:
    """Flower on our Celery app, in this process: what ``celery flower`` does, with our app
    object instead of one found by ``-A``. SIGTERM and SIGINT end :meth:`run`, which then saves
    the persistent state.

    Internal: ``flower.command``'s option helpers (``apply_env_options``, ``apply_options``,
    ``extract_settings``, ``setup_logging``, ``sigterm_handler``), ``flower.urls.settings``,
    tornado's global ``options``, and ``Flower(capp=, options=, **settings)`` with its
    ``events`` thread (``state``, ``on_enable_events``), ``io_loop``, ``start_http_server``,
    ``start`` and ``stop``.
    """

    def __init__(self, celery_app: Celery, argv: list[str]) -> None:
        from flower import command as flower_command
        from flower.app import Flower
        from flower.urls import settings as flower_settings
        from tornado.options import options

        # Environment first, then our explicit options, so the command line wins.
        flower_command.apply_env_options()
        flower_command.apply_options("toolfleet flower", argv)
        flower_command.extract_settings()
        flower_command.setup_logging()

        # Flower's result and control handlers build AsyncResult(task_id) on the current app.
        celery_app.set_current()
        celery_app.set_default()
        self.options: Any = options
        self.flower: Any = Flower(capp=celery_app, options=options, **flower_settings)
        track_calls(self.flower.events.state)
        # SIGTERM/SIGINT → SystemExit → stop(), which saves the persistent state.
        signal.signal(signal.SIGTERM, flower_command.sigterm_handler)
        signal.signal(signal.SIGINT, flower_command.sigterm_handler)

    def listen(self) -> int:
        """Bind the HTTP server; the port it listens on (OSError when it cannot bind)."""
        port: int = self.flower.start_http_server()
        return port

    def every(self, interval_ms: int, function: Callable[[], None]) -> None:
        """Call ``function`` every ``interval_ms`` on Flower's loop."""
        from tornado.ioloop import PeriodicCallback

        PeriodicCallback(function, interval_ms).start()

    def stop_loop(self) -> None:
        """End :meth:`run` (from a callback on Flower's loop)."""
        self.flower.io_loop.stop()

    def run(self) -> None:
        """Serve until SIGTERM, SIGINT or :meth:`stop_loop`; then save the state."""
        if self.options.enable_events:
            # Flower's own enable_events timer first fires after 5 s; ask at once, so the
            # workers' task events (off until a monitor asks, toolfleet.workers.monitor) flow from
            # the start. Run on the loop, after Flower's event receiver has started listening.
            self.flower.io_loop.add_callback(self.flower.events.on_enable_events)
        try:
            self.flower.start()
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.flower.stop()
