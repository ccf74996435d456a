"""C7: JSON only, call_id idempotency, and the worker-lost rule."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery
from kombu import Connection, Exchange, Producer

import tests.support.sample_tools  # noqa: F401  (registers the tools the workers run)
from tests.support.fleet import WorkerProcess, collect_replies, make_call, start_worker
from tests.support.waiting import until
from toolfleet.dispatcher.send.enqueue import publish_calls
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallResult
from toolfleet.workers.app import EXECUTE_TASK, create_app, settings_of
from toolfleet.workers.registry import registry
from toolfleet.workers.store import HEARTBEAT_STALE_S, AsyncRecordStore, StartedMarker


def test_pickle_message_is_refused_and_its_tool_never_runs(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "pickled.txt"
    message = make_call("append_line", {"path": str(path), "text": "from pickle"})
    queue = settings_of(celery_app).sync_queue
    task_message = celery_app.amqp.as_task_v2(
        message.call_id, EXECUTE_TASK, args=(message.model_dump(mode="json"),)
    )
    with Connection(str(celery_app.conf.broker_url)) as conn:
        Producer(conn).publish(
            task_message.body,
            serializer="pickle",
            headers=task_message.headers,
            exchange=Exchange(queue, type="direct"),
            routing_key=queue,
            declare=[],
            **task_message.properties,
        )
    until(
        lambda: "Refusing to deserialize untrusted content of type pickle" in sync_worker.log(),
        timeout_s=15,
        what="the worker to refuse the pickle message",
    )
    # Refused before decoding: no tool ran, no record, no Celery task for the call.
    assert not path.exists()
    assert not redis_client.exists(Keys().event(message.call_id))
    assert not redis_client.exists(Keys().started(message.call_id))
    assert f"[{message.call_id}] received" not in sync_worker.log()


def test_the_same_message_published_twice_runs_the_tool_once(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "once.txt"
    reply_to = "toolfleet:reply:test-c7-twice"
    message = make_call("append_line", {"path": str(path), "text": "x"}, reply_to=reply_to)
    tool = registry.get("append_line")
    # Both copies are on the queue at once: the sync worker's 4 processes may take both.
    publish_calls(celery_app, [(message, tool), (message, tool)])
    (first,) = collect_replies(redis_client, reply_to, 1, timeout_s=15)
    assert first.status is EventStatus.COMPLETED
    until(
        lambda: sync_worker.log().count(f"[{message.call_id}] succeeded") >= 2,
        timeout_s=15,
        what="both deliveries to finish",
    )
    assert path.read_text() == "x\n"
    # A third, later delivery returns the stored record (pushed again) and runs nothing.
    publish_calls(celery_app, [(message, tool)])
    replies = collect_replies(redis_client, reply_to, 1, timeout_s=15)
    assert replies[-1].event == first.event
    assert path.read_text() == "x\n"


def _plant_lost_marker(client: redis.Redis, call_id: str) -> None:
    dead = StartedMarker(worker="ghost@nowhere", pid=1, attempt=0, beat_at=time.time() - 3600)
    client.set(Keys().started(call_id), dead.to_json())


def test_a_call_whose_worker_was_lost_fails_when_not_idempotent(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "lost.txt"
    reply_to = "toolfleet:reply:test-lost"
    message = make_call("append_line", {"path": str(path), "text": "x"}, reply_to=reply_to)
    _plant_lost_marker(redis_client, message.call_id)  # as a worker killed mid-call leaves it
    publish_calls(celery_app, [(message, registry.get("append_line"))])
    (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=15)
    assert result.status is EventStatus.FAILED
    error = result.execution["error"]
    assert error["error"] == "WorkerLostError"
    assert "ghost@nowhere" in error["message"] and "'append_line'" in error["message"]
    assert "idempotent=True" in error["message"]
    assert not path.exists()
    state = celery_app.AsyncResult(message.call_id)
    until(lambda: state.state == "FAILURE", timeout_s=10, what="Celery state FAILURE")


def test_a_call_whose_worker_was_lost_reruns_when_idempotent(
    async_worker: WorkerProcess,
    sync_worker: WorkerProcess,
    celery_app: Celery,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    path = tmp_path / "rerun.txt"
    reply_to = "toolfleet:reply:test-rerun"
    message = make_call(
        "append_line_idempotent", {"path": str(path), "text": "x"}, reply_to=reply_to
    )
    _plant_lost_marker(redis_client, message.call_id)
    publish_calls(celery_app, [(message, registry.get("append_line_idempotent"))])
    (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=15)
    assert result.status is EventStatus.COMPLETED
    assert path.read_text() == "x\n"
    assert not redis_client.exists(Keys().started(message.call_id))


def test_a_retry_attempt_runs_again_after_a_failed_attempt(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    reply_to = "toolfleet:reply:test-retry"
    first = make_call("fail", {"message": "first"}, reply_to=reply_to)
    publish_calls(celery_app, [(first, registry.get("fail"))])
    (failed,) = collect_replies(redis_client, reply_to, 1, timeout_s=15)
    assert failed.status is EventStatus.FAILED and failed.attempt == 0
    retry = first.model_copy(update={"attempt": 1, "arguments": {"message": "second"}})
    publish_calls(celery_app, [(retry, registry.get("fail"))])
    (again,) = collect_replies(redis_client, reply_to, 1, timeout_s=15)
    assert again.attempt == 1
    assert again.execution["error"]["message"] == "second"
    state = celery_app.AsyncResult(f"{first.call_id}.1")
    until(lambda: state.state == "FAILURE", timeout_s=10, what="Celery state FAILURE")


@pytest.mark.slow
def test_a_worker_killed_mid_call_leaves_a_call_that_fails_as_worker_lost(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A real crash: SIGKILL the worker while a non-idempotent tool runs; the redelivered
    message must end FAILED (WorkerLostError), never run the tool a second time."""
    queue = f"toolfleet.sync.crash-{uuid.uuid4().hex[:8]}"
    # A short visibility timeout so Redis redelivers the unacked message within the test.
    env = {"TOOLFLEET_SYNC_QUEUE": queue, "TOOLFLEET_VISIBILITY_TIMEOUT_S": "2"}
    app = create_app(Settings(broker_url=redis_url, sync_queue=queue))
    path = tmp_path / "crash.txt"
    reply_to = "toolfleet:reply:test-crash"
    message = make_call("append_then_sleep", {"path": str(path), "seconds": 60}, reply_to=reply_to)
    first = start_worker("sync", redis_url=redis_url, concurrency=1, env=env)
    second = None
    try:
        publish_calls(app, [(message, registry.get("append_then_sleep"))])
        until(lambda: path.exists(), timeout_s=15, what="the tool to start its side effect")
        first.kill()
        second = start_worker("sync", redis_url=redis_url, concurrency=1, env=env)
        (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=45)
        assert result.status is EventStatus.FAILED
        assert result.execution["error"]["error"] == "WorkerLostError"
        assert first.hostname in result.execution["error"]["message"]
        assert path.read_text() == "started\n"  # the tool's effect happened once
    finally:
        first.stop()
        if second is not None:
            second.stop()
        app.close()


def test_two_redeliveries_of_a_lost_call_take_over_its_marker_only_once(redis_url: str) -> None:
    """Only one of several deliveries racing past a dead worker's marker may run the tool."""
    call_id = str(uuid.uuid4())
    keys = Keys(f"toolfleet-takeover-{uuid.uuid4().hex[:8]}")
    dead = StartedMarker("dead@host", 1, 0, time.time() - HEARTBEAT_STALE_S - 1)

    async def race() -> list[StartedMarker | None]:
        store = AsyncRecordStore.from_url(redis_url, keys, record_ttl_s=60)
        try:
            await store.client.set(keys.started(call_id), dead.to_json())
            contenders = [StartedMarker.now(f"w{i}@host", 0) for i in range(8)]
            return await asyncio.gather(*(store.take_over(call_id, m) for m in contenders))
        finally:
            await store.client.delete(keys.started(call_id))
            await store.aclose()

    outcomes = asyncio.run(race())
    winners = [o for o in outcomes if o is None]
    assert len(winners) == 1
    holders = {o.worker for o in outcomes if o is not None}
    assert len(holders) == 1 and holders != {"dead@host"}  # the others see the live winner


def test_begin_returns_the_stored_record_or_claims_or_names_the_holder(redis_url: str) -> None:
    """C7's first look and claim are one atomic round trip, with each of its three answers."""
    keys = Keys(f"toolfleet-begin-{uuid.uuid4().hex[:8]}")
    finished = make_call("echo", {"value": 1})
    retried = make_call("echo", {"value": 2}).model_copy(update={"attempt": 1})
    held = make_call("echo", {"value": 3})

    def record(call_id: str, attempt: int) -> str:
        event = {"id": "e", "created_at": "t", "execution": {"status": "completed"}}
        return CallResult(
            call_id=call_id, function="echo", event=event, attempt=attempt
        ).model_dump_json()

    async def scenario() -> None:
        store = AsyncRecordStore.from_url(redis_url, keys, record_ttl_s=60)
        client = store.client
        try:
            await client.set(keys.event(finished.call_id), record(finished.call_id, 0))
            await client.set(keys.event(retried.call_id), record(retried.call_id, 0))
            other = StartedMarker.now("other@host", 0)
            await client.set(keys.started(held.call_id), other.to_json())
            mine = StartedMarker.now("me@host", 0)

            stored, holder = await store.begin(finished.call_id, mine)
            assert stored is not None and stored.call_id == finished.call_id and holder is None
            assert await client.get(keys.started(finished.call_id)) is None  # nothing claimed

            retry_marker = StartedMarker.now("me@host", 1)
            stored, holder = await store.begin(retried.call_id, retry_marker)
            assert (stored, holder) == (None, None)  # attempt 0's record does not answer attempt 1
            claimed = await client.get(keys.started(retried.call_id))
            assert claimed == retry_marker.to_json().encode()

            stored, holder = await store.begin(held.call_id, mine)
            assert stored is None and holder == other
        finally:
            await client.delete(*(keys.event(m.call_id) for m in (finished, retried, held)))
            await client.delete(*(keys.started(m.call_id) for m in (finished, retried, held)))
            await store.aclose()

    asyncio.run(scenario())
