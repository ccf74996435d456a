"""Everything the dispatcher reads of kombu's Redis transport beyond its documented API, and
the one message it writes past kombu's producer.

Written against kombu 5.7.0 (Celery 5.7.0, redis-py 8.1.0). kombu documents how to publish and
consume, not where its Redis transport keeps a message; the dispatcher needs the latter to say
where a call is (:mod:`toolfleet.dispatcher.watch.whereabouts`), to count what workers hold
reserved (``toolfleet status``) and to drop the reservations an interrupted embedded fleet left
behind. What kombu's API does tell (a queue's depth: a passive ``queue_declare``; dropping the
queued messages: ``app.control.purge``) is asked through it, not here.
``tests/integration/test_kombu_internals.py`` checks every key name and payload shape here
against the installed kombu, through a real publish to a real Redis, and fails naming what
changed; when it fails, fix this module, nowhere else. The workers' and Flower's counterparts are
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

The direct publishing path (:mod:`toolfleet.dispatcher.send.direct`) LPUSHes a call's message on
the dispatcher's own asyncio client; :func:`task_message_json` writes that message as Celery and
kombu would (``AMQP.as_task_v2``'s private ``task_message``, kombu's serializer registry, the
Redis channel's ``prepare_message`` and ``_inplace_augment_message``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery
from kombu.serialization import dumps as kombu_serialize
from kombu.utils.json import dumps as kombu_json
from kombu.utils.uuid import uuid as delivery_tag
from redis.asyncio.client import Pipeline

from toolfleet.schemas.errors import ConfigurationError

__all__ = [
    "KOMBU_WRITTEN_AGAINST",
    "PRIORITY_SEPARATOR",
    "PRIORITY_STEPS",
    "UNACKED_INDEX_KEY",
    "UNACKED_KEY",
    "UNACKED_MUTEX_KEY",
    "KombuMessage",
    "count_reserved",
    "decode_message",
    "drop_reservations",
    "queue_lists",
    "read_queued_and_reserved",
    "split_queued_and_reserved",
    "task_message_json",
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


def count_reserved(client: redis.Redis) -> int:
    """How many messages workers hold reserved and have not acknowledged (every queue)."""
    return int(client.hlen(UNACKED_KEY))


def drop_reservations(client: redis.Redis) -> None:
    """Delete every reservation of any worker (``app.control.purge`` drops only what waits in
    the queues). Only for a broker no worker or caller uses any more (an interrupted embedded
    fleet's)."""
    client.delete(UNACKED_KEY, UNACKED_INDEX_KEY, UNACKED_MUTEX_KEY)


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
        raise ConfigurationError(
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


# Celery's task_default_delivery_mode names, as kombu's Message turns them into numbers.
_DELIVERY_MODE = {"transient": 1, "persistent": 2}


def task_message_json(
    app: Celery,
    task_id: str,
    task_name: str,
    args: tuple[Any, ...],
    queue: str,
    options: dict[str, Any],
) -> str:
    """The JSON kombu's Redis transport LPUSHes onto ``queue`` for ``app.send_task(task_name,
    args=args, task_id=task_id, queue=queue, **options)``, the delivery tag and ``reply_to``
    (per publish) aside. ``options``: ``shadow``, ``argsrepr``, ``kwargsrepr``, ``headers`` and
    the time limits, as :func:`toolfleet.dispatcher.send.enqueue.send_options` makes them; for
    an app whose transport and serializer :func:`toolfleet.dispatcher.send.direct.
    direct_publish_possible` accepts."""
    options = dict(options)
    headers = options.pop("headers", None) or {}
    task = app.amqp.as_task_v2(
        task_id,
        task_name,
        args,
        {},
        reply_to=app.thread_oid,
        time_limit=options.pop("time_limit", None),
        soft_time_limit=options.pop("soft_time_limit", None),
        create_sent_event=False,
        ignore_result=None,  # what send_task passes when the caller sets none
        shadow=options.pop("shadow"),
        argsrepr=options["argsrepr"],
        kwargsrepr=options["kwargsrepr"],
    )
    message_headers = task.headers
    message_headers.update(headers)
    properties = task.properties
    properties.update(options)  # argsrepr, kwargsrepr: send_task leaves them there too
    conf = app.conf
    properties["delivery_mode"] = _DELIVERY_MODE.get(
        conf.task_default_delivery_mode, conf.task_default_delivery_mode
    )
    content_type, content_encoding, body = kombu_serialize(task.body, serializer="json")
    raw = body.encode(content_encoding) if isinstance(body, str) else body
    # The Redis channel's prepare_message and _inplace_augment_message.
    properties["delivery_info"] = {}
    properties["priority"] = 0
    properties["body_encoding"] = "base64"
    properties["delivery_tag"] = delivery_tag()
    properties["delivery_info"].update(exchange="", routing_key=queue)
    wrapped = {
        "body": base64.b64encode(raw).decode("ascii"),
        "content-encoding": content_encoding,
        "content-type": content_type,
        "headers": message_headers,
        "properties": properties,
    }
    return str(kombu_json(wrapped))
