"""Every kombu Redis-transport internal dispatcher/infra/kombu_internals.py reads is still
there, with the layout it was written against: the key names on the installed kombu's
Channel, and where a real publish to a real Redis puts a message, queued and reserved, in what
shape. A failure names what changed; fix dispatcher/infra/kombu_internals.py (and nothing else)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
import redis
import redis.asyncio as aioredis
from kombu import Connection, Queue
from kombu.transport import redis as kombu_redis

import tests.support.sample_tools  # noqa: F401  (registers the echo tool)
from tests.support.fleet import make_call
from tests.support.internals_support import change_message
from tests.support.redis_server import PrivateRedis
from toolfleet.cli.broker_probe import queue_depths
from toolfleet.dispatcher.infra.kombu_internals import (
    KOMBU_WRITTEN_AGAINST,
    PRIORITY_SEPARATOR,
    PRIORITY_STEPS,
    UNACKED_INDEX_KEY,
    UNACKED_KEY,
    UNACKED_MUTEX_KEY,
    count_reserved,
    decode_message,
    queue_lists,
    read_queued_and_reserved,
    split_queued_and_reserved,
)
from toolfleet.dispatcher.send.direct import direct_publish_possible, encode_call, publish_direct
from toolfleet.dispatcher.send.enqueue import publish_calls, send_options
from toolfleet.dispatcher.watch.whereabouts import call_ids_of
from toolfleet.embedded.redis_server import purge_queues
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.tasks import EXECUTE_TASK
from toolfleet.workers.app import create_app
from toolfleet.workers.registry import registry

changed = change_message(
    "dispatcher/infra/kombu_internals.py",
    f"kombu {KOMBU_WRITTEN_AGAINST}",
    f"kombu {kombu.__version__}",
)


@pytest.fixture()
def queue(redis_client: redis.Redis) -> Iterator[str]:
    """A queue of this test's own on the session's DB: no worker consumes it."""
    name = f"test-kombu-{uuid.uuid4().hex[:8]}"
    yield name
    redis_client.delete(*queue_lists(name))


def test_the_redis_channel_keeps_reservations_under_the_keys_we_read() -> None:
    channel = kombu_redis.Channel
    for attribute, ours in (
        ("unacked_key", UNACKED_KEY),
        ("unacked_index_key", UNACKED_INDEX_KEY),
        ("unacked_mutex_key", UNACKED_MUTEX_KEY),
        ("sep", PRIORITY_SEPARATOR),
    ):
        theirs = getattr(channel, attribute, None)
        assert theirs == ours, changed(
            f"kombu.transport.redis.Channel.{attribute} is {theirs!r}, not {ours!r}"
        )
    assert tuple(channel.priority_steps) == PRIORITY_STEPS, changed(
        f"Channel.priority_steps is {channel.priority_steps}, not {list(PRIORITY_STEPS)}"
    )
    assert channel.global_keyprefix == "", changed(
        f"Channel.global_keyprefix defaults to {channel.global_keyprefix!r}: every key moved"
    )


def test_each_priority_of_a_queue_lands_in_its_list(redis_url: str, queue: str) -> None:
    lists = queue_lists(queue)
    with Connection(redis_url) as connection:
        channel = connection.default_channel
        theirs = [channel._q_for_pri(queue, step) for step in channel.priority_steps]
        assert theirs == lists, changed(
            f"kombu spreads the queue over the lists {theirs}, not {lists}"
        )
        producer = connection.Producer()
        for priority in PRIORITY_STEPS:
            producer.publish(
                {"priority": priority},
                routing_key=queue,
                declare=[Queue(queue)],
                priority=priority,
            )
        client = redis.Redis.from_url(redis_url)
        try:
            where = {name: int(client.llen(name)) for name in lists}
            assert where == dict.fromkeys(lists, 1), changed(
                f"one message of each priority {PRIORITY_STEPS} landed {where} over {lists}"
            )
            their_count = Queue(queue, channel=channel).queue_declare().message_count
            assert their_count == len(lists), changed(
                f"kombu counts {their_count} messages on the queue, not one per list of {lists}"
            )
        finally:
            client.close()
    # toolfleet status asks kombu (a passive queue_declare), every priority counted.
    app = create_app(Settings(broker_url=redis_url))
    try:
        assert queue_depths(app, [queue, f"{queue}-empty"]) == {
            queue: len(lists),
            f"{queue}-empty": 0,
        }
    finally:
        app.close()


def _publish_a_call(redis_url: str, queue: str) -> str:
    """Publish one call through the dispatcher's own path; its call id."""
    app = create_app(Settings(broker_url=redis_url, sync_queue=queue))
    try:
        message = make_call("echo", {"value": 1})
        publish_calls(app, [(message, registry.get("echo"))])
    finally:
        app.close()
    return message.call_id


def test_a_published_call_is_a_json_message_whose_headers_and_body_decode(
    redis_url: str, redis_client: redis.Redis, queue: str
) -> None:
    call_id = _publish_a_call(redis_url, queue)
    (raw,) = redis_client.lrange(queue, 0, -1)
    payload: Any = json.loads(raw)
    assert isinstance(payload, dict) and {"body", "headers", "properties"} <= set(payload), changed(
        f"a queued message is {str(payload)[:200]}, not a dict of body/headers/properties"
    )
    assert payload["properties"].get("body_encoding") == "base64", changed(
        f"the body is encoded {payload['properties'].get('body_encoding')!r}, not base64"
    )
    message = decode_message(raw)
    assert message is not None, changed(f"decode_message refused {raw[:200]!r}")
    assert (message.task_id, message.task_name) == (call_id, EXECUTE_TASK), changed(
        f"the headers name task {message.task_name!r} id {message.task_id!r}"
    )
    body = message.body()
    assert isinstance(body, list) and len(body) == 3, changed(
        f"the decoded body is {str(body)[:200]}, not Celery's [args, kwargs, embed]"
    )
    assert body[0][0]["call_id"] == call_id, changed(f"the body's args are {body[0]}")
    assert call_ids_of(raw) == {call_id}
    assert redis_client.llen(queue) == 1


@pytest.mark.parametrize(
    ("function", "arguments", "timeout_s"),
    [
        ("echo", {"value": 1}, None),
        ("slow_sync", {"seconds": 0.1}, None),  # the tool's time limits in the headers
        ("with_secret", {"query": "q", "api_key": "sk-x"}, 3.0),  # redacted argsrepr
        ("sleep_async", {"seconds": 0.1}, 2.0),  # the async queue, no time limit
    ],
)
def test_a_direct_publish_queues_what_kombu_would(
    redis_url: str,
    redis_client: redis.Redis,
    queue: str,
    function: str,
    arguments: dict[str, Any],
    timeout_s: float | None,
) -> None:
    # For speed, toolfleet.dispatcher.send.direct writes kombu's message itself (no publishing
    # thread); the bytes it queues must be what kombu's producer queues for the same call,
    # but for the delivery tag (a fresh uuid per publish) and Celery's reply_to (the
    # publishing thread's id).
    settings = Settings(broker_url=redis_url, sync_queue=queue, async_queue=queue)
    app = create_app(settings)
    message = make_call(function, arguments, timeout_s=timeout_s)
    tool = registry.get(function)
    try:
        assert direct_publish_possible(app)
        publish_calls(app, [(message, tool)])
        (theirs_raw,) = redis_client.lrange(queue, 0, -1)
        redis_client.delete(queue)
        target, options = send_options(settings, message, tool)
        assert target == queue

        async def direct() -> None:
            client = aioredis.Redis.from_url(redis_url)
            try:
                await publish_direct(
                    client, [(target, encode_call(app, message, tool, target, options))]
                )
            finally:
                await client.aclose()

        asyncio.run(direct())
        (ours_raw,) = redis_client.lrange(queue, 0, -1)
    finally:
        app.close()
    theirs, ours = json.loads(theirs_raw), json.loads(ours_raw)
    for payload in (theirs, ours):
        assert payload["properties"].pop("delivery_tag")
        assert payload["properties"].pop("reply_to")
    assert ours == theirs, changed(
        f"kombu queues {json.dumps(theirs)[:600]}, toolfleet.dispatcher.send.direct "
        f"{json.dumps(ours)[:600]}: fix dispatcher/send/direct.py"
    )
    assert call_ids_of(ours_raw) == {message.call_id}


def test_a_reserved_call_is_in_unacked_as_message_exchange_routing_key(
    redis_url: str, redis_client: redis.Redis, queue: str
) -> None:
    call_id = _publish_a_call(redis_url, queue)
    with Connection(redis_url) as connection:
        channel = connection.default_channel
        reserved = channel.basic_get(queue, no_ack=False)  # what a worker's consumer does
        assert reserved is not None, changed("basic_get found nothing on the queue just published")
        tag = reserved.delivery_tag
        try:
            raw = redis_client.hget(UNACKED_KEY, tag)
            assert raw is not None, changed(
                f"a reserved message is not in the {UNACKED_KEY!r} hash"
            )
            entry = json.loads(raw)
            assert isinstance(entry, list) and len(entry) == 3, changed(
                f"an {UNACKED_KEY!r} entry is {str(entry)[:200]}, not [message, exchange, key]"
            )
            message = decode_message(raw)
            assert message is not None and message.task_id == call_id, changed(
                f"the {UNACKED_KEY!r} entry decodes to {message}"
            )
            score = redis_client.zscore(UNACKED_INDEX_KEY, tag)
            assert score is not None, changed(
                f"a reservation is not scored in {UNACKED_INDEX_KEY!r}"
            )
            assert count_reserved(redis_client) >= 1
            queued, reservations = asyncio.run(_look(redis_url, [queue]))
            assert queued == {queue: []}, "a reserved message is still queued"
            assert call_id in {c for r in reservations for c in call_ids_of(r)}, (
                "read_queued_and_reserved did not see the reservation"
            )
        finally:
            reserved.ack()
        assert redis_client.hget(UNACKED_KEY, tag) is None, changed("an ack left the reservation")
        assert redis_client.zscore(UNACKED_INDEX_KEY, tag) is None, changed(
            f"an ack left the delivery tag in {UNACKED_INDEX_KEY!r}"
        )


async def _look(url: str, queues: list[str]) -> tuple[dict[str, list[bytes]], list[bytes]]:
    client = aioredis.Redis.from_url(url)
    try:
        async with client.pipeline(transaction=True) as pipe:
            read_queued_and_reserved(pipe, queues)
            replies = await pipe.execute()
    finally:
        await client.aclose()
    return split_queued_and_reserved(replies, queues)


def test_read_queued_and_reserved_sees_every_priority(redis_url: str, queue: str) -> None:
    with Connection(redis_url) as connection:
        producer = connection.Producer()
        for priority in (0, 9):
            producer.publish(
                {"p": priority}, routing_key=queue, declare=[Queue(queue)], priority=priority
            )
    queued, _ = asyncio.run(_look(redis_url, [queue]))
    assert len(queued[queue]) == 2, f"saw {len(queued[queue])} of 2 messages over two priorities"
    with pytest.raises(ValueError, match=f"expected {len(PRIORITY_STEPS) + 1} replies"):
        split_queued_and_reserved([[], []], [queue])


def test_purge_queues_leaves_no_queued_or_reserved_message() -> None:
    # An interrupted embedded fleet's leftovers: kombu purges the queues
    # (app.control.purge), drop_reservations the unacked hash. Its own Redis: dropping the
    # unacked hash of the session's DB would drop other tests'.
    broker = PrivateRedis()
    broker.start()
    queue = "test-kombu-drop"
    try:
        with Connection(broker.url) as connection:
            producer = connection.Producer()
            for priority in (0, 0, 9):
                producer.publish(
                    {"p": priority}, routing_key=queue, declare=[Queue(queue)], priority=priority
                )
            channel = connection.default_channel
            assert channel.basic_get(queue, no_ack=False) is not None
            client = broker.client()
            try:
                queued = sum(int(client.llen(name)) for name in queue_lists(queue))
                assert (queued, count_reserved(client)) == (2, 1)
                assert client.exists(UNACKED_INDEX_KEY)
                purge_queues(broker.url, Settings(broker_url=broker.url, sync_queue=queue))
                left = sorted(
                    name
                    for key in client.scan_iter()
                    # kombu's records of a queue's bindings, not messages
                    if not (name := key.decode(errors="replace")).startswith("_kombu.binding")
                )
                assert left == [], f"purge_queues left {left}"
                assert Queue(queue, channel=channel).queue_declare().message_count == 0
            finally:
                client.close()
    finally:
        broker.kill()
