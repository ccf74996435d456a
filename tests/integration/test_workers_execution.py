"""Calls run on real workers; records in Redis and Celery states mirror the event."""

from __future__ import annotations

import os
import time

import pytest
import redis
from celery import Celery

import tests.support.sample_tools  # noqa: F401  (registers the tools the workers run)
from tests.support.fleet import WorkerProcess, run_calls
from tests.support.waiting import until
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallResult


def celery_state(app: Celery, task_id: str) -> str:
    result = app.AsyncResult(task_id)
    return str(
        until(
            lambda: result.state if result.state in ("SUCCESS", "FAILURE", "REVOKED") else None,
            timeout_s=10,
            what=f"a final Celery state for {task_id}",
        )
    )


def stored(client: redis.Redis, result: CallResult) -> CallResult:
    raw = client.get(Keys().event(result.call_id))
    assert raw is not None, f"no record stored under {Keys().event(result.call_id)}"
    return CallResult.model_validate_json(raw)  # type: ignore[arg-type]


def test_each_kind_reaches_only_its_own_queue(
    sync_worker: WorkerProcess,
    async_worker: WorkerProcess,
    celery_app: Celery,
    redis_client: redis.Redis,
) -> None:
    sync_result, async_result = run_calls(
        celery_app, redis_client, [("whoami", {}), ("whoami_async", {})]
    )
    assert sync_result.worker == sync_worker.hostname
    assert async_result.worker == async_worker.hostname
    until(
        lambda: async_result.call_id in async_worker.log(),
        timeout_s=10,
        what="the async worker to log its call",
    )
    assert sync_result.call_id not in async_worker.log()
    assert async_result.call_id not in sync_worker.log()


def test_sync_tool_runs_in_a_worker_process(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    (result,) = run_calls(celery_app, redis_client, [("whoami", {})])
    assert result.status is EventStatus.COMPLETED
    pid = result.execution["response"]["pid"]
    assert pid != os.getpid()
    # A prefork child of the worker, not the worker's main process.
    with open(f"/proc/{pid}/stat") as f:
        parent_pid = int(f.read().rsplit(")", 1)[1].split()[1])
    assert parent_pid == sync_worker.pid
    assert result.worker == sync_worker.hostname


def test_blocking_tools_overlap_up_to_concurrency(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    n, sleep_s = 4, 1.0  # the sync_worker fixture runs 4 processes
    started = time.monotonic()
    results = run_calls(celery_app, redis_client, [("sleep_sync", {"seconds": sleep_s})] * n)
    wall_s = time.monotonic() - started
    assert all(r.status is EventStatus.COMPLETED for r in results)
    assert wall_s < n * sleep_s * 0.6, f"{n} x {sleep_s}s blocking calls took {wall_s:.2f}s"


@pytest.mark.parametrize(
    ("function", "arguments"),
    [("echo", {"value": {"a": [1, 2]}}), ("sleep_async", {"seconds": 0.01})],
)
def test_completed_call_is_recorded_and_succeeds(
    sync_worker: WorkerProcess,
    async_worker: WorkerProcess,
    celery_app: Celery,
    redis_client: redis.Redis,
    function: str,
    arguments: dict[str, object],
) -> None:
    (result,) = run_calls(celery_app, redis_client, [(function, arguments)])
    assert result.status is EventStatus.COMPLETED
    record = stored(redis_client, result)
    assert record == result
    assert record.event["arguments"] == arguments
    assert record.execution["error"] is None
    assert record.execution["duration"] >= 0
    assert not redis_client.exists(Keys().started(result.call_id))
    assert celery_state(celery_app, result.call_id) == "SUCCESS"
    assert celery_app.AsyncResult(result.call_id).result["call_id"] == result.call_id


def test_none_result_is_completed(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    (result,) = run_calls(celery_app, redis_client, [("returns_none", {})])
    assert result.status is EventStatus.COMPLETED
    assert result.execution["response"] is None
    assert celery_state(celery_app, result.call_id) == "SUCCESS"


@pytest.mark.parametrize("function", ["fail", "fail_async"])
def test_failed_call_is_recorded_and_fails_with_the_tools_error(
    sync_worker: WorkerProcess,
    async_worker: WorkerProcess,
    celery_app: Celery,
    redis_client: redis.Redis,
    function: str,
) -> None:
    (result,) = run_calls(celery_app, redis_client, [(function, {"message": "kaput 42"})])
    assert result.status is EventStatus.FAILED
    assert stored(redis_client, result).execution["error"] == {
        "error": "ValueError",
        "message": "kaput 42",
        "module": "builtins",
    }
    assert celery_state(celery_app, result.call_id) == "FAILURE"
    error = celery_app.AsyncResult(result.call_id).result
    assert type(error).__name__ == "ValueError"
    assert str(error) == "kaput 42"


@pytest.mark.parametrize(
    ("function", "fragment"),
    [("slow_sync", "time limit of 0.5s"), ("slow_async", "timeout_s=0.5")],
)
def test_timeout_fails_with_tool_timeout_error(
    sync_worker: WorkerProcess,
    async_worker: WorkerProcess,
    celery_app: Celery,
    redis_client: redis.Redis,
    function: str,
    fragment: str,
) -> None:
    started = time.monotonic()
    (result,) = run_calls(celery_app, redis_client, [(function, {"seconds": 30})])
    assert time.monotonic() - started < 10, "the 0.5 s limit did not stop a 30 s tool"
    assert result.status is EventStatus.FAILED
    error = result.execution["error"]
    assert error["error"] == "ToolTimeoutError"
    assert function in error["message"] and fragment in error["message"]
    assert celery_state(celery_app, result.call_id) == "FAILURE"
    assert type(celery_app.AsyncResult(result.call_id).result).__name__ == "ToolTimeoutError"


def test_unknown_tool_fails_naming_the_tool_and_loaded_modules(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    (result,) = run_calls(celery_app, redis_client, [("os.system", {"command": "true"})])
    assert result.status is EventStatus.FAILED
    error = stored(redis_client, result).execution["error"]
    assert error["error"] == "UnknownToolError"
    assert "'os.system'" in error["message"]
    assert "tests.support.sample_tools" in error["message"]
    # No tool, no secret list: every argument value is hidden.
    assert result.event["arguments"] == {"command": "***"}
    assert celery_state(celery_app, result.call_id) == "FAILURE"


def test_sync_tool_returning_an_awaitable_fails_with_type_error(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    (result,) = run_calls(celery_app, redis_client, [("returns_awaitable", {})])
    assert result.status is EventStatus.FAILED
    assert result.execution["error"]["error"] == "TypeError"
    assert "returns_awaitable" in result.execution["error"]["message"]


def test_secret_arguments_never_reach_records_results_or_logs(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    secret = "sk-never-log-me-0xC0FFEE"
    (result,) = run_calls(
        celery_app, redis_client, [("with_secret", {"query": "q", "api_key": secret})]
    )
    assert result.status is EventStatus.COMPLETED
    assert result.event["arguments"] == {"query": "q", "api_key": "***"}
    assert celery_state(celery_app, result.call_id) == "SUCCESS"
    # The worker logs "Task tool:with_secret[<id>] received" with the args; wait for the
    # success line so the whole exchange is in the log before reading it.
    until(
        lambda: result.call_id in sync_worker.log() and "succeeded" in sync_worker.log(),
        timeout_s=10,
        what="the worker's log lines for the call",
    )
    log = sync_worker.log()
    assert "tool:with_secret" in log
    assert secret not in log
    for key in redis_client.scan_iter():
        value = redis_client.get(key) if redis_client.type(key) == b"string" else b""
        assert secret.encode() not in (value or b""), f"secret stored under {key!r}"


def test_a_tool_ignoring_the_soft_limit_is_killed_at_the_hard_limit_and_recorded(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis
) -> None:
    started = time.monotonic()
    (result,) = run_calls(celery_app, redis_client, [("stubborn_sync", {"seconds": 30})])
    assert time.monotonic() - started < 20
    assert result.status is EventStatus.FAILED
    error = result.execution["error"]
    assert error["error"] == "ToolTimeoutError"
    assert "'stubborn_sync'" in error["message"] and "hard time_limit" in error["message"]
    assert celery_state(celery_app, result.call_id) == "FAILURE"
