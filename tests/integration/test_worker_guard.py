"""Workers enforce what a message claims (C6 and the JSON contract): hand-made messages, put on
the broker straight through kombu, get the same contract the dispatcher applies; a sync tool
never runs on the asyncio pool; ``reply_to`` must be one of this fleet's reply lists; Celery's
built-in tasks are not registered on a toolfleet worker.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from kombu import Connection, Exchange, Producer

from tests.support.fleet import WorkerProcess, collect_replies
from tests.support.waiting import until
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.wire import CallResult
from toolfleet.workers.app import EXECUTE_TASK, settings_of


def publish_raw(app: Celery, body: dict[str, Any], *, queue: str, task: str = EXECUTE_TASK) -> None:
    """One message built like Celery does, bypassing every dispatcher check."""
    task_id = str(body.get("call_id") or uuid.uuid4())
    message = app.amqp.as_task_v2(task_id, task, args=(body,))
    with Connection(str(app.conf.broker_url)) as conn:
        Producer(conn).publish(
            message.body,
            serializer="json",
            headers=message.headers,
            exchange=Exchange(queue, type="direct"),
            routing_key=queue,
            declare=[],
            **message.properties,
        )


def hand_made(function: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "call_id": str(uuid.uuid4()),
        "function": function,
        "arguments": arguments,
        "reply_to": f"toolfleet:reply:guard-{uuid.uuid4().hex[:8]}",
        **extra,
    }


def one_reply(client: redis.Redis, body: dict[str, Any]) -> CallResult:
    (result,) = collect_replies(client, body["reply_to"], 1, timeout_s=20)
    assert result.call_id == body["call_id"]
    return result


def test_a_hand_made_message_breaking_the_contract_fails_on_the_worker(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis, tmp_path: Path
) -> None:
    queue = settings_of(celery_app).sync_queue
    path = tmp_path / "never.txt"
    surrogate = hand_made("append_line", {"path": str(path), "text": "x\ud800"})
    oversized = hand_made(
        "append_line",
        {"path": str(path), "text": "x" * (settings_of(celery_app).max_argument_bytes + 1)},
    )
    valid = hand_made("echo", {"value": "still serving"})
    for body in (surrogate, oversized, valid):
        publish_raw(celery_app, body, queue=queue)

    bad = one_reply(redis_client, surrogate)
    assert bad.status.value == "failed"
    assert bad.execution["error"]["error"] == "NotJSONError"
    assert "arguments.text: lone surrogate U+D800" in bad.execution["error"]["message"]
    big = one_reply(redis_client, oversized)
    assert big.execution["error"]["error"] == "OversizedArgumentsError"
    assert "TOOLFLEET_MAX_ARGUMENT_BYTES" in big.execution["error"]["message"]
    assert one_reply(redis_client, valid).execution["response"] == "still serving"
    assert not path.exists()  # the tool never ran for either


def test_a_sync_tool_sent_to_the_async_pool_fails_and_never_blocks_the_loop(
    async_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    queue = settings_of(celery_app).async_queue
    blocking = hand_made("sleep_sync", {"seconds": 5})
    quick = [hand_made("sleep_async", {"seconds": 0.001}) for _ in range(20)]
    started = time.monotonic()
    publish_raw(celery_app, blocking, queue=queue)
    for body in quick:
        publish_raw(celery_app, body, queue=queue)

    refused = one_reply(redis_client, blocking)
    assert refused.execution["error"]["error"] == "RefusedCallError"
    message = refused.execution["error"]["message"]
    assert "'sleep_sync' is a sync tool but its call reached the async pool" in message
    for body in quick:
        assert one_reply(redis_client, body).status.value == "completed"
    assert time.monotonic() - started < 4  # nothing slept 5 s on the loop


def test_a_foreign_reply_to_is_refused_and_nothing_is_pushed_there(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    keys = Keys()
    for foreign in (keys.history("some-branch"), keys.event("x"), "other:reply:abc"):
        redis_client.delete(foreign)
        body = hand_made("echo", {"value": 1}, reply_to=foreign)
        publish_raw(celery_app, body, queue=settings_of(celery_app).sync_queue)
        raw = until(
            lambda b=body: redis_client.get(keys.event(b["call_id"])),
            timeout_s=20,
            what="the refused call's record",
        )
        record = CallResult.model_validate_json(raw)
        assert record.execution["error"]["error"] == "RefusedCallError"
        assert "is not a reply list of this fleet" in record.execution["error"]["message"]
        if foreign != keys.event("x"):
            assert not redis_client.exists(foreign)


def test_only_toolfleet_tasks_are_registered_on_a_worker(
    sync_worker: WorkerProcess, celery_app: Celery
) -> None:
    replies = celery_app.control.inspect(destination=[sync_worker.hostname], timeout=5).registered()
    assert replies, "the worker did not answer inspect registered"
    names = replies[sync_worker.hostname]
    assert names and all(name.startswith("toolfleet.") for name in names), names
    publish_raw(
        celery_app,
        {"call_id": str(uuid.uuid4())},
        queue=settings_of(celery_app).sync_queue,
        task="celery.accumulate",
    )
    until(
        lambda: "Received unregistered task of type 'celery.accumulate'" in sync_worker.log(),
        timeout_s=15,
        what="the worker to refuse celery.accumulate",
    )
