"""Publishing calls on the loop's own Redis client: no thread hop, one round trip.

kombu's producers block and are not thread-safe, so the dispatcher publishes through them in
its publishing thread: every publish is a hop to that thread and back, on top of the round trip.
A call's message is nothing kombu-specific once written, though: kombu's Redis transport
LPUSHes a JSON object onto the list named like the queue. Here the dispatcher writes the same
object on its asyncio client, built as Celery and kombu build it
(:func:`toolfleet.dispatcher.infra.kombu_internals.task_message_json`, where every internal it
leans on is kept), so the workers, ``toolfleet status`` and the reconciler see exactly what
kombu would have sent. ``tests/integration/test_kombu_internals.py`` publishes one call both
ways and compares the two.

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

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis
from celery import Celery, signals

from toolfleet.dispatcher.infra.kombu_internals import task_message_json
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
    :class:`~toolfleet.broker.liveness.MonitorWatch`, re-read at most once a second), so the
    loop never blocks on a synchronous read. Raises the client's error when it cannot read."""
    watch = monitor_watch_of(app)
    return True if watch is None else await watch.read_async(client)


def encode_call(
    app: Celery, message: CallMessage, tool: Tool, queue: str, options: dict[str, Any]
) -> str:
    """The JSON kombu's Redis transport would LPUSH onto ``queue`` for
    ``send_task(EXECUTE_TASK, ..., queue=queue, **options)`` (``options``:
    :func:`toolfleet.dispatcher.send.enqueue.send_options`)."""
    return task_message_json(
        app, task_id_for(message), EXECUTE_TASK, (message.model_dump(mode="json"),), queue, options
    )


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
        for queue, payload in encoded:
            pipe.lpush(queue, payload)
        replies = await pipe.execute(raise_on_error=False)
    # One reply per command, in order: the LPUSHes' are the last ones.
    ahead = len(replies) - len(encoded)
    for reply in replies[ahead:]:
        if isinstance(reply, Exception):
            raise reply
    return list(replies[:ahead])
