"""toolfleet.execute_many — several calls per message, each its own record."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

import tests.support.sample_tools  # noqa: F401  (registers the tools the workers run)
from tests.support.fleet import WorkerProcess, collect_replies, make_call
from tests.support.waiting import until
from toolfleet.dispatcher.send.bundles import publish_bundles
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage, CallResult
from toolfleet.workers.bundle import EXECUTE_MANY_TASK
from toolfleet.workers.registry import registry


def _reply_key() -> str:
    return f"toolfleet:reply:test-batch-{uuid.uuid4().hex}"


def _calls(reply_to: str, *calls: tuple[str, dict[str, Any]]) -> list[tuple[CallMessage, Tool]]:
    return [(make_call(f, a, reply_to=reply_to), registry.get(f)) for f, a in calls]


def _by_id(results: list[CallResult]) -> dict[str, CallResult]:
    return {r.call_id: r for r in results}


def test_every_batched_call_gets_its_own_record_and_reply(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    reply_to = _reply_key()
    calls = _calls(reply_to, *[("echo", {"value": i}) for i in range(250)])
    task_ids = publish_bundles(celery_app, calls, bundle_size=100)
    assert len(task_ids) == 3  # 100 + 100 + 50

    results = _by_id(collect_replies(redis_client, reply_to, 250, timeout_s=30))
    assert len(results) == 250
    for i, (message, _) in enumerate(calls):
        result = results[message.call_id]
        assert result.status is EventStatus.COMPLETED
        assert result.execution["response"] == i
        assert result.worker == sync_worker.hostname
        assert redis_client.get(Keys().event(message.call_id)) is not None
        assert redis_client.get(Keys().started(message.call_id)) is None


def test_a_failed_call_does_not_touch_its_siblings(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    reply_to = _reply_key()
    calls = _calls(
        reply_to, ("echo", {"value": "a"}), ("fail", {"message": "nope"}), ("returns_none", {})
    )
    publish_bundles(celery_app, calls)
    results = _by_id(collect_replies(redis_client, reply_to, 3, timeout_s=30))
    echo, fail, none = (results[m.call_id] for m, _ in calls)
    assert echo.status is EventStatus.COMPLETED and echo.execution["response"] == "a"
    assert fail.status is EventStatus.FAILED
    assert fail.execution["error"] == {
        "error": "ValueError",
        "message": "nope",
        "module": "builtins",
    }
    assert none.status is EventStatus.COMPLETED and none.execution["response"] is None


def test_a_repeated_batched_call_returns_the_stored_record_without_running_again(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "effects.txt"
    reply_to = _reply_key()
    calls = _calls(reply_to, ("append_line", {"path": str(path), "text": "once"}))
    publish_bundles(celery_app, calls)
    (first,) = collect_replies(redis_client, reply_to, 1, timeout_s=30)
    publish_bundles(celery_app, calls)  # the same call_id again (C7)
    (second,) = collect_replies(redis_client, reply_to, 1, timeout_s=30)
    assert first.status is EventStatus.COMPLETED
    assert second.model_dump() == first.model_dump()
    assert path.read_text().splitlines() == ["once"]


def test_batched_async_calls_wait_together_on_the_asyncio_pool(
    async_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    n, sleep_s = 200, 0.5
    reply_to = _reply_key()
    calls = _calls(reply_to, *[("sleep_async", {"seconds": sleep_s})] * n)
    started = time.monotonic()
    publish_bundles(celery_app, calls, bundle_size=100)
    results = collect_replies(redis_client, reply_to, n, timeout_s=60)
    wall_s = time.monotonic() - started
    assert all(r.status is EventStatus.COMPLETED for r in results)
    assert all(r.worker == async_worker.hostname for r in results)
    # One after the other this would take n * sleep_s = 100 s.
    assert wall_s < 10 * sleep_s, f"{n} batched async calls took {wall_s:.2f}s"


def test_a_call_revoked_before_its_batch_runs_ends_cancelled(
    async_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    reply_to = _reply_key()
    calls = _calls(reply_to, ("sleep_async", {"seconds": 0.01}), ("sleep_async", {"seconds": 0}))
    revoked_id = calls[0][0].call_id
    celery_app.control.revoke(revoked_id)
    until(
        lambda: any(
            revoked_id in ids
            for ids in (
                celery_app.control.inspect(destination=[async_worker.hostname], timeout=1).revoked()
                or {}
            ).values()
        ),
        timeout_s=10,
        what="the async worker to learn of the revoke",
    )
    publish_bundles(celery_app, calls)
    results = _by_id(collect_replies(redis_client, reply_to, 2, timeout_s=30))
    assert results[revoked_id].status is EventStatus.CANCELLED
    assert results[calls[1][0].call_id].status is EventStatus.COMPLETED


def test_a_malformed_item_is_skipped_and_its_siblings_run(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    reply_to = _reply_key()
    good = make_call("echo", {"value": 7}, reply_to=reply_to)
    celery_app.send_task(
        EXECUTE_MANY_TASK,
        args=([{"not": "a call"}, good.model_dump(mode="json")],),
        queue=celery_app.conf.task_default_queue,
    )
    (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=30)
    assert result.call_id == good.call_id
    assert result.status is EventStatus.COMPLETED


def test_batch_size_below_one_is_a_configuration_error(celery_app: Celery) -> None:
    with pytest.raises(ConfigurationError, match="bundle_size must be at least 1, got 0"):
        publish_bundles(celery_app, [], bundle_size=0)


def test_a_sync_tools_timeout_is_enforced_per_call_inside_a_batch(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    """slow_sync (timeout_s=0.5) blocks for 20 s unless stopped; its siblings still run."""
    reply_to = _reply_key()
    calls = _calls(
        reply_to,
        ("slow_sync", {"seconds": 20.0}),
        ("echo", {"value": 1}),
        ("slow_sync", {"seconds": 20.0}),
        ("echo", {"value": 2}),
    )
    start = time.monotonic()
    publish_bundles(celery_app, calls, bundle_size=4)
    results = _by_id(collect_replies(redis_client, reply_to, 4, timeout_s=30))
    elapsed_s = time.monotonic() - start
    # Two 20 s sleeps run to the end would take 40 s: each was stopped at its own 0.5 s.
    assert elapsed_s < 15, elapsed_s
    for message, tool in calls:
        result = results[message.call_id]
        if tool.function == "slow_sync":
            assert result.status is EventStatus.FAILED
            error = result.execution["error"]
            assert error["error"] == "ToolTimeoutError", error
            assert "0.5" in error["message"]
        else:
            assert result.status is EventStatus.COMPLETED
            assert result.execution["response"] == message.arguments["value"]
