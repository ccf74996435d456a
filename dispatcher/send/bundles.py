"""Publishing calls in bundles: several calls per ``toolfleet.execute_many`` message.

The dispatcher's half of opt-in bundling; :mod:`toolfleet.workers.bundle` is the
worker's. Flower shows one task per bundle, named ``bundle:<function>:<n>``, its args listing the
call ids (never the arguments).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import redis
from celery import Celery
from kombu.exceptions import KombuError, OperationalError

from toolfleet.schemas import tracing
from toolfleet.schemas.errors import BrokerError, ConfigurationError
from toolfleet.schemas.settings import masked_url
from toolfleet.schemas.tasks import EXECUTE_MANY_TASK
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage
from toolfleet.workers.app_info import settings_of

__all__ = ["DEFAULT_BUNDLE_SIZE", "bundle_task_id", "publish_bundles", "publishing"]

# Large enough to amortize one Celery message over many echoes, small enough that a bundle
# of a slow tool does not hold a whole worker for long, and that a lost worker re-runs little.
DEFAULT_BUNDLE_SIZE = 100
# Flower shows at most this many call ids in a bundle task's args.
_ARGSREPR_MAX_IDS = 20


def bundle_task_id() -> str:
    return f"bundle-{uuid.uuid4()}"


def publish_bundles(
    app: Celery, calls: Sequence[tuple[CallMessage, Tool]], bundle_size: int = DEFAULT_BUNDLE_SIZE
) -> list[str]:
    """Enqueue ``calls`` as ``toolfleet.execute_many`` messages of up to ``bundle_size`` calls.

    Calls are grouped by queue (sync / async) in input order. Returns the bundle task ids.
    Raises BrokerError naming the broker when it cannot be reached.
    """
    if bundle_size < 1:
        raise ConfigurationError(
            f"bundle_size must be at least 1, got {bundle_size!r}; use 1 to send one call per "
            f"message or leave it at {DEFAULT_BUNDLE_SIZE}"
        )
    settings = settings_of(app)
    by_queue: dict[str, list[tuple[CallMessage, Tool]]] = {}
    for message, tool in calls:
        queue = settings.queue_for(tool.kind)
        by_queue.setdefault(queue, []).append((message, tool))
    task_ids = []
    with publishing(app, "bundled calls") as producer:
        for queue, queued in by_queue.items():
            for start in range(0, len(queued), bundle_size):
                chunk = queued[start : start + bundle_size]
                task_id = bundle_task_id()
                app.send_task(
                    EXECUTE_MANY_TASK,
                    args=([m.model_dump(mode="json") for m, _ in chunk],),
                    task_id=task_id,
                    queue=queue,
                    shadow=_shadow(chunk),
                    argsrepr=_argsrepr(chunk),
                    kwargsrepr="{}",
                    producer=producer,
                    headers=tracing.trace_headers(m for m, _ in chunk),
                )
                task_ids.append(task_id)
    return task_ids


@contextlib.contextmanager
def publishing(app: Celery, what: str) -> Iterator[Any]:
    """One producer connection of ``app`` to publish ``what`` over. A broker or connection
    error meanwhile is raised as BrokerError naming the broker (password masked), with the
    error as its cause (toolfleet.dispatcher.send.enqueue.is_outage reads it)."""
    try:
        with app.producer_or_acquire() as producer:
            yield producer
    except (OperationalError, KombuError, redis.RedisError, OSError) as exc:
        raise BrokerError(
            f"cannot enqueue {what} on broker {masked_url(str(app.conf.broker_url))}: "
            f"{masked_url(str(exc))}; check that Redis is running and TOOLFLEET_BROKER_URL "
            f"points at it"
        ) from exc


def _shadow(chunk: Sequence[tuple[CallMessage, Tool]]) -> str:
    functions = sorted({tool.function for _, tool in chunk})
    name = functions[0] if len(functions) == 1 else "+".join(functions[:3])
    return f"bundle:{name}:{len(chunk)}"


def _argsrepr(chunk: Sequence[tuple[CallMessage, Tool]]) -> str:
    # Call ids only: arguments (and any secret among them) never reach Flower from here.
    ids = [m.call_id for m, _ in chunk[:_ARGSREPR_MAX_IDS]]
    more = len(chunk) - len(ids)
    return repr(ids) + (f" +{more} more" if more else "")
