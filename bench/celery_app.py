"""The raw-Celery baseline: a plain Celery app whose tasks call the same bench tools.

Celery defaults throughout (prefetch 4, early ack), except JSON-only content, so the baseline
is what a team gets from plain Celery. Workers find the broker in ``BENCH_BROKER_URL``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from celery import Celery

from bench import tools

__all__ = ["ECHO", "ECHO_ASYNC", "QUEUE", "SLEEP_ASYNC", "SLEEP_SYNC", "make_app"]

QUEUE = "bench.raw"
ECHO = "bench.echo"
ECHO_ASYNC = "bench.echo_async"
SLEEP_SYNC = "bench.sleep_sync"
SLEEP_ASYNC = "bench.sleep_async"

_loops = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    # One loop per pool thread, reused: plain Celery's cheapest way to await a coroutine.
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, "loop", None)
    if loop is None:
        loop = asyncio.new_event_loop()
        _loops.loop = loop
    return loop


# Celery settings toolfleet turns on for reliability (C7) and Flower (C10); with
# BENCH_CELERY_PROFILE=toolfleet the baseline pays for them too, which separates Celery's cost
# of those settings from toolfleet's own.
TOOLFLEET_PROFILE: dict[str, Any] = {
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "worker_prefetch_multiplier": 1,
    "worker_send_task_events": True,
    "task_send_sent_event": True,
    "task_track_started": True,
}


# Only the redelivery settings (no events, no started state): what acks_late with prefetch 1
# alone costs Celery, the part of toolfleet's settings the design keeps whatever is watching.
RELIABLE_PROFILE: dict[str, Any] = {
    key: TOOLFLEET_PROFILE[key]
    for key in ("task_acks_late", "task_reject_on_worker_lost", "worker_prefetch_multiplier")
}


def make_app(broker_url: str, profile: str | None = None) -> Celery:
    app = Celery("bench_raw", broker=broker_url, backend=broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_default_queue=QUEUE,
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    chosen = profile or os.environ.get("BENCH_CELERY_PROFILE")
    if chosen == "toolfleet":
        app.conf.update(TOOLFLEET_PROFILE)
    elif chosen == "reliable":
        app.conf.update(RELIABLE_PROFILE)

    @app.task(name=ECHO, shared=False)
    def echo(value: Any) -> Any:
        return tools.echo(value)

    @app.task(name=ECHO_ASYNC, shared=False)
    def echo_async(value: Any) -> Any:
        return _thread_loop().run_until_complete(tools.echo_async(value))

    @app.task(name=SLEEP_SYNC, shared=False)
    def sleep_sync(seconds: float) -> float:
        return tools.sleep_sync(seconds)

    @app.task(name=SLEEP_ASYNC, shared=False)
    def sleep_async(seconds: float) -> float:
        return _thread_loop().run_until_complete(tools.sleep_async(seconds))

    return app


# The worker command (`celery -A bench.celery_app worker`) imports this module-level app.
app = make_app(os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/7"))
