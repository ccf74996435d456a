"""Publishing calls on the loop's own Redis client: no thread hop, one round trip.

kombu's producers block and are not thread-safe, so the dispatcher publishes through them in
its publishing thread: every publish is a hop to that thread and back, on top of the round trip.
A call's message is nothing kombu-specific once written, though: kombu's Redis transport
LPUSHes a JSON object onto the list named like the queue. Here the dispatcher writes the same
object on its asyncio client — Celery's own task message (``AMQP.as_task_v2``: the same
headers, properties and body ``send_task`` makes), serialized by kombu's registry, wrapped as
kombu's Redis channel wraps it (``prepare_message``, ``_inplace_augment_message``) — so the
workers, ``toolfleet status`` and the reconciler see exactly what kombu would have sent.
``tests/test_kombu_internals.py`` publishes one call both ways and compares the two.

Because the message goes through a pipeline of the dispatcher's own client, commands that must
reach Redis before it (the batch journal, :mod:`toolfleet.dispatcher.history.journal`) ride in front
of it in the same pipeline: Redis runs one connection's commands in order, so the journal is written
before the message is queued, without a round trip of its own.

Used only where nothing else hangs on kombu's publish: no ``before/after_task_publish``
receivers (tracing integrations listen there), no key prefix or non-JSON serializer in the
transport, and nobody watching (a monitor wants the ``task-sent`` event, which kombu's path
sends). Otherwise the caller uses kombu (:func:`toolfleet.dispatcher.send.enqueue.publish_calls`).
With a Celery result backend set, the worker still stores each result there; what is skipped is
``send_task``'s per-call subscription to it (``Backend.on_task_call``), which the dispatcher never
reads — ``AsyncResult(call_id).state`` and ``.get()`` read the stored result (Celery's Redis backend
reads the stored meta before it waits on its channel).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis
from celery import Celery, signals
from kombu.serialization import dumps as kombu_serialize
from kombu.utils.json import dumps as kombu_json
from kombu.utils.uuid import uuid as delivery_tag

from toolfleet.schemas.tasks import EXECUTE_TASK, task_id_for
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage
from toolfleet.workers.app_info import monitor_watch_of

__all__ = [
    "LeadCommands",
    "PipelineStep",
    "direct_publish_possible",
    "encode_call",
    "publish_direct",
    "watched",
]

# Commands a caller adds to the publishing pipeline ahead of the messages.
PipelineStep = Callable[[Any], None]


class LeadCommands(Protocol):
    r"""Commands that must reach Redis before a batch's first message (the batch journal,
    :class:`toolfleet.dispatcher.history.journal.JournalOpening`): claimed by one publisher, which
    sends them in its pipeline (``add_to``) or alone (``send_alone``), then settle them."""

    def claim(self) -> bool: ...

    async def wait(self) -> None: ...

    def add_to(self, pipe: Any) -> None: ...

    def settle(self, error: BaseException | None) -> None: ...

    async def send_alone(self, client: aioredis.Redis) -> None: ...


_DELIVERY_MODE = {"transient": 1, "persistent": 2}


def direct_publish_possible(app: Celery) -> bool:
    """Whether a call's message may skip kombu's producer (see the module docstring)."""
    conf = app.conf
    options = conf.broker_transport_options or {}
    return (
        conf.task_serializer == "json"
        and not conf.task_compression
        and conf.task_protocol == 2
        and not options.get("global_keyprefix")
        and not signals.before_task_publish.receivers
        and not signals.after_task_publish.receivers
        and not signals.task_sent.receivers
    )


async def watched(app: Celery, client: aioredis.Redis) -> bool:
    """:func:`toolfleet.workers.monitor.is_watched` read on the loop's client (the app's one
    :class:`~toolfleet.schemas.liveness.MonitorWatch`, re-read at most once a second), so the
    loop never blocks on a synchronous read. Raises the client's error when it cannot read."""
    watch = monitor_watch_of(app)
    return True if watch is None else await watch.read_async(client)


def encode_call(
    app: Celery, message: CallMessage, tool: Tool, queue: str, options: dict[str, Any]
) -> str:
    """The JSON kombu's Redis transport would LPUSH onto ``queue`` for
    ``send_task(EXECUTE_TASK, ..., queue=queue, **options)`` (``options``:
    :func:`toolfleet.dispatcher.send.enqueue.send_options`)."""
    options = dict(options)
    headers = options.pop("headers", None) or {}
    task_id = task_id_for(message)
    task = app.amqp.as_task_v2(
        task_id,
        EXECUTE_TASK,
        (message.model_dump(mode="json"),),
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


async def publish_direct(
    client: aioredis.Redis,
    encoded: Sequence[tuple[str, str]],
    before: Sequence[PipelineStep] = (),
) -> list[Any]:
    """LPUSH each ``(queue, message JSON)`` in one pipeline, after ``before``'s commands.

    Returns the replies of ``before``'s commands (an exception object where one failed);
    raises the error of a failed LPUSH, or the connection error that lost the pipeline."""
    async with client.pipeline(transaction=False) as pipe:
        for step in before:
            step(pipe)
        ahead = len(pipe.command_stack)
        for queue, payload in encoded:
            pipe.lpush(queue, payload)
        replies = await pipe.execute(raise_on_error=False)
    for reply in replies[ahead:]:
        if isinstance(reply, Exception):
            raise reply
    return list(replies[:ahead])
