"""The asyncio pool runs many async tools at once on one loop thread, and cancels."""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import redis
from celery import Celery

import tests.support.sample_tools  # noqa: F401  (registers the tools the workers run)
from tests.support.fleet import WorkerProcess, collect_replies, make_call, run_calls, start_worker
from tests.support.waiting import until
from toolfleet.dispatcher.send.cancel import cancel_running
from toolfleet.dispatcher.send.enqueue import publish_calls
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.workers.app import create_app
from toolfleet.workers.registry import registry


def test_500_async_sleeps_overlap_on_one_loop_thread(
    async_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    n, delay_s = 500, 0.2
    started = time.monotonic()
    results = run_calls(
        celery_app, redis_client, [("whoami_async", {"delay_s": delay_s})] * n, timeout_s=90
    )
    wall_s = time.monotonic() - started
    assert [r.status for r in results] == [EventStatus.COMPLETED] * n
    # Serial time would be n x delay_s = 100 s; Celery's per-message cost dominates instead
    # (about 5 s here; the bound leaves room for a machine shared with other test runs).
    assert wall_s < n * delay_s / 3, f"{n} async sleeps of {delay_s}s took {wall_s:.1f}s"
    # And the sleeps really were in flight together (one at a time would give 1; about 60
    # here, bounded by how fast Celery hands messages over, not by the pool).
    windows = sorted(
        (datetime.fromisoformat(r.event["created_at"]).timestamp(), r.execution["duration"])
        for r in results
    )
    overlap = max(
        sum(1 for other_start, _ in windows if start <= other_start < start + duration)
        for start, duration in windows
    )
    assert overlap >= 10, f"at most {overlap} of {n} async calls were in flight at once"
    assert {r.execution["response"]["pid"] for r in results} == {async_worker.pid}
    assert len({r.execution["response"]["thread"] for r in results}) == 1
    assert {r.worker for r in results} == {async_worker.hostname}


def _start_long_call(celery_app: Celery, redis_client: redis.Redis, reply_to: str) -> str:
    message = make_call("sleep_async", {"seconds": 60}, reply_to=reply_to)
    publish_calls(celery_app, [(message, registry.get("sleep_async"))])
    until(
        lambda: redis_client.exists(Keys().started(message.call_id)),
        timeout_s=15,
        what="the call to start running",
    )
    return message.call_id


def test_cancel_running_ends_the_call_cancelled_and_revoked(
    async_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    reply_to = "toolfleet:reply:test-cancel-running"
    call_id = _start_long_call(celery_app, redis_client, reply_to)
    assert cancel_running(celery_app, [call_id]) >= 1
    (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=10)
    assert result.call_id == call_id
    assert result.status is EventStatus.CANCELLED
    assert result.execution["duration"] is not None
    state = celery_app.AsyncResult(call_id)
    until(lambda: state.state == "REVOKED", timeout_s=10, what="Celery state REVOKED")


def test_revoke_terminate_cancels_a_running_async_call(
    async_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    reply_to = "toolfleet:reply:test-revoke-terminate"
    call_id = _start_long_call(celery_app, redis_client, reply_to)
    celery_app.control.revoke(call_id, terminate=True)
    (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=10)
    assert result.status is EventStatus.CANCELLED
    state = celery_app.AsyncResult(call_id)
    until(lambda: state.state == "REVOKED", timeout_s=10, what="Celery state REVOKED")


def test_a_revoked_queued_call_is_recorded_cancelled_and_never_runs(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis, tmp_path
) -> None:
    path = tmp_path / "never.txt"
    reply_to = "toolfleet:reply:test-revoke-queued"
    message = make_call("append_line", {"path": str(path), "text": "x"}, reply_to=reply_to)
    # reply=True: the worker has the id in its revoked set before the message exists.
    replies = celery_app.control.revoke(
        message.call_id, destination=[sync_worker.hostname], reply=True, timeout=5
    )
    assert replies, "the sync worker did not acknowledge the revoke"
    publish_calls(celery_app, [(message, registry.get("append_line"))])
    (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=10)
    assert result.status is EventStatus.CANCELLED
    assert not path.exists()
    state = celery_app.AsyncResult(message.call_id)
    until(lambda: state.state == "REVOKED", timeout_s=10, what="Celery state REVOKED")


def test_calls_waiting_for_a_slot_can_be_cancelled_or_revoked(
    redis_url: str, redis_client: redis.Redis
) -> None:
    # One coroutine slot: the first call holds it, the others wait inside the pool.
    queue = f"toolfleet.async.slots-{uuid.uuid4().hex[:8]}"
    worker = start_worker(
        "async", redis_url=redis_url, concurrency=1, env={"TOOLFLEET_ASYNC_QUEUE": queue}
    )
    app = create_app(Settings(broker_url=redis_url, async_queue=queue))
    try:
        reply_to = f"toolfleet:reply:test-slots-{uuid.uuid4().hex[:8]}"
        holder, waiting, revoked = (
            make_call("sleep_async", {"seconds": 60}, reply_to=reply_to) for _ in range(3)
        )
        tool = registry.get("sleep_async")
        publish_calls(app, [(holder, tool), (waiting, tool), (revoked, tool)])
        until(
            lambda: redis_client.exists(Keys().started(holder.call_id)),
            timeout_s=15,
            what="the first call to hold the only slot",
        )
        until(
            lambda: worker.log().count("Task tool:sleep_async[") >= 3,
            timeout_s=15,
            what="the worker to receive all three calls",
        )
        assert cancel_running(app, [waiting.call_id]) >= 1
        (first,) = collect_replies(redis_client, reply_to, 1, timeout_s=10)
        assert (first.call_id, first.status) == (waiting.call_id, EventStatus.CANCELLED)

        app.control.revoke(revoked.call_id, destination=[worker.hostname], reply=True, timeout=5)
        cancel_running(app, [holder.call_id])  # frees the slot; the revoked call must not run
        results = {r.call_id: r for r in collect_replies(redis_client, reply_to, 2, timeout_s=10)}
        assert results[holder.call_id].status is EventStatus.CANCELLED
        assert results[revoked.call_id].status is EventStatus.CANCELLED
        assert not redis_client.exists(Keys().started(revoked.call_id))
        assert worker.ping()
    finally:
        worker.stop()
        app.close()
