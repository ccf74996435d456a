"""Everything the dispatcher reads of kombu's Redis transport beyond its documented API.

Written against kombu 5.7.0 (Celery 5.7.0, redis-py 8.1.0). kombu documents how to publish and
consume, not where its Redis transport keeps a message; the dispatcher needs the latter to say
where a call is (:mod:`toolfleet.dispatcher.watch.whereabouts`), to count what waits
(``toolfleet status``) and to drop what an interrupted embedded fleet left behind.
``tests/test_kombu_internals.py`` checks every key name and payload shape here against the installed
kombu, through a real publish to a real Redis, and fails naming what changed; when it fails, fix
this module, nowhere else. The workers' and Flower's counterparts are
:mod:`toolfleet.workers.celery_internals` and :mod:`toolfleet.cli.flower_internals`.

The layout, as kombu 5.7.0's ``kombu.transport.redis.Channel`` keeps it (no ``global_keyprefix``
and the default ``priority_steps``: toolfleet sets neither):

- **queued**: a queue is one Redis list per priority step, named ``<queue>`` for priority 0 and
  ``<queue>\\x06\\x16<step>`` above it (``Channel._q_for_pri``); a publish LPUSHes the message
  as JSON, a consumer RPOPs it.
- **reserved** (delivered, not yet acknowledged): the ``unacked`` hash maps a delivery tag to
  the JSON list ``[message, exchange, routing_key]``; the ``unacked_index`` sorted set scores
  the tag with the time it was reserved (what the visibility timeout is measured from) and
  ``unacked_mutex`` guards kombu's sweep of overdue ones back to their queue.
- **a message**: a JSON object with ``headers`` (Celery's ``id`` and ``task``), ``properties``
  (``body_encoding``, ``base64`` by default) and ``body``, the encoded Celery body.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.asyncio.client import Pipeline

__all__ = [
    "KOMBU_WRITTEN_AGAINST",
    "PRIORITY_SEPARATOR",
    "PRIORITY_STEPS",
    "UNACKED_INDEX_KEY",
    "UNACKED_KEY",
    "UNACKED_MUTEX_KEY",
    "KombuMessage",
    "count_queued",
    "count_reserved",
    "decode_message",
    "drop_every_message",
    "queue_lists",
    "read_queued_and_reserved",
    "split_queued_and_reserved",
]

KOMBU_WRITTEN_AGAINST = "5.7.0"

# Channel.unacked_key: delivery tag -> JSON [message, exchange, routing_key] of a reserved message.
UNACKED_KEY = "unacked"
# Channel.unacked_index_key: delivery tag scored by when it was reserved.
UNACKED_INDEX_KEY = "unacked_index"
# Channel.unacked_mutex_key: held while kombu restores overdue reservations to their queue.
UNACKED_MUTEX_KEY = "unacked_mutex"
# Channel.sep and Channel.priority_steps: the lists a queue is spread over, one per step.
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)


def queue_lists(queue: str) -> list[str]:
    """The Redis lists kombu keeps ``queue``'s waiting messages in, priority 0's first."""
    return [queue if step == 0 else f"{queue}{PRIORITY_SEPARATOR}{step}" for step in PRIORITY_STEPS]


def count_queued(client: redis.Redis, queue: str) -> int:
    """How many messages wait on ``queue`` (every priority), not yet taken by a worker."""
    with client.pipeline(transaction=False) as pipe:
        for name in queue_lists(queue):
            pipe.llen(name)
        return sum(int(size) for size in pipe.execute())


def count_reserved(client: redis.Redis) -> int:
    """How many messages workers hold reserved and have not acknowledged (every queue)."""
    return int(client.hlen(UNACKED_KEY))


def drop_every_message(client: redis.Redis, queues: Iterable[str]) -> None:
    """Delete every message waiting on ``queues`` and every reservation of any worker.

    Only for a broker no worker or caller uses any more (an interrupted embedded fleet's).
    """
    doomed = [name for queue in queues for name in queue_lists(queue)]
    client.delete(*doomed, UNACKED_KEY, UNACKED_INDEX_KEY, UNACKED_MUTEX_KEY)


def read_queued_and_reserved(pipe: Pipeline, queues: Sequence[str]) -> None:
    """Add to ``pipe`` the reads of every message waiting on ``queues`` and of every reserved
    one; hand the replies they produce, in order, to :func:`split_queued_and_reserved`."""
    for queue in queues:
        for name in queue_lists(queue):
            pipe.lrange(name, 0, -1)
    pipe.hvals(UNACKED_KEY)


def split_queued_and_reserved(
    replies: Sequence[Any], queues: Sequence[str]
) -> tuple[dict[str, list[bytes]], list[bytes]]:
    """(the raw messages waiting on each queue, the raw reserved entries) out of the replies of
    :func:`read_queued_and_reserved` for the same ``queues``."""
    per_queue = len(PRIORITY_STEPS)
    expected = len(queues) * per_queue + 1
    if len(replies) != expected:
        raise ValueError(
            f"expected {expected} replies for {len(queues)} queues, got {len(replies)}: pass "
            "exactly the replies of read_queued_and_reserved for the same queues"
        )
    queued: dict[str, list[bytes]] = {}
    for index, queue in enumerate(queues):
        lists = replies[index * per_queue : (index + 1) * per_queue]
        queued[queue] = [raw for messages in lists for raw in messages]
    return queued, list(replies[-1])


@dataclass(frozen=True, slots=True)
class KombuMessage:
    """One message as kombu's Redis transport stores it, queued or reserved."""

    headers: dict[str, Any]
    properties: dict[str, Any]
    raw_body: Any

    @property
    def task_id(self) -> str | None:
        task_id = self.headers.get("id")
        return task_id if isinstance(task_id, str) else None

    @property
    def task_name(self) -> str | None:
        name = self.headers.get("task")
        return name if isinstance(name, str) else None

    def body(self) -> Any:
        """The Celery body decoded from JSON (``(args, kwargs, embed)``), or None when it is
        not JSON. Decoded on demand: most lookups need only the headers."""
        body = self.raw_body
        if not isinstance(body, str | bytes):
            return None
        try:
            if self.properties.get("body_encoding") == "base64":
                body = base64.b64decode(body)
            return json.loads(body)
        except (ValueError, TypeError):
            return None


def decode_message(raw: bytes | str) -> KombuMessage | None:
    """A queued message or a reserved entry (``[message, exchange, routing_key]``) of kombu's
    Redis transport, or None when ``raw`` is not one."""
    try:
        payload = json.loads(raw)
    except (ValueError, TypeError):
        return None
    if isinstance(payload, list):  # an ``unacked`` entry
        payload = payload[0] if payload else None
    if not isinstance(payload, dict):
        return None
    headers = payload.get("headers") or {}
    properties = payload.get("properties") or {}
    if not isinstance(headers, dict) or not isinstance(properties, dict):
        return None
    return KombuMessage(headers=headers, properties=properties, raw_body=payload.get("body"))
