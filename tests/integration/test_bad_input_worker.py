"""Workers refuse what they must not run: messages that are not JSON, bodies that
are not a CallMessage, and calls naming a tool outside their registry, published straight
through kombu. Nothing runs for them, nothing is imported, and the worker keeps serving.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult
from kombu import Connection, Exchange, Producer

from tests.support.fleet import WorkerProcess, collect_replies, run_calls
from tests.support.waiting import until
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.wire import CallResult
from toolfleet.workers.app import EXECUTE_TASK, settings_of


def publish_raw(app: Celery, task_id: str, args: tuple[Any, ...], serializer: str) -> None:
    """One ``toolfleet.execute`` message, built like Celery does, in any serializer."""
    queue = settings_of(app).sync_queue
    message = app.amqp.as_task_v2(task_id, EXECUTE_TASK, args=args)
    with Connection(str(app.conf.broker_url)) as conn:
        Producer(conn).publish(
            message.body,
            serializer=serializer,
            headers=message.headers,
            exchange=Exchange(queue, type="direct"),
            routing_key=queue,
            declare=[],
            **message.properties,
        )


def test_a_yaml_message_is_refused_and_its_tool_never_runs(
    sync_worker: WorkerProcess, celery_app: Celery, redis_client: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "yaml.txt"
    call_id = str(uuid.uuid4())
    body = {
        "call_id": call_id,
        "function": "append_line",
        "arguments": {"path": str(path), "text": "x"},
    }
    publish_raw(celery_app, call_id, (body,), "yaml")
    until(
        lambda: "Refusing to deserialize untrusted content of type yaml" in sync_worker.log(),
        timeout_s=15,
        what="the worker to refuse the yaml message",
    )
    assert not path.exists()
    assert not redis_client.exists(Keys().event(call_id))
    assert not redis_client.exists(Keys().started(call_id))


@pytest.mark.parametrize(
    "function",
    [
        "os.system",  # a callable anywhere: never imported
        "tests.support.sample_tools.append_line",  # a dotted path to a real tool: still not a name
        "append_line ",  # near miss
        "__import__",
    ],
)
def test_a_call_naming_an_unregistered_tool_fails_and_runs_nothing(
    function: str,
    sync_worker: WorkerProcess,
    celery_app: Celery,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    path = tmp_path / "never.txt"
    reply_to = f"toolfleet:reply:test-unknown-{uuid.uuid4().hex[:8]}"
    call_id = str(uuid.uuid4())
    body = {
        "call_id": call_id,
        "function": function,
        "arguments": {"command": f"touch {path}", "path": str(path), "text": "x"},
        "reply_to": reply_to,
    }
    publish_raw(celery_app, call_id, (body,), "json")
    (result,) = collect_replies(redis_client, reply_to, 1, timeout_s=15)
    assert result.execution["status"] == "failed"
    error = result.execution["error"]
    assert error["error"] == "UnknownToolError"
    assert repr(function) in error["message"] and "tests.support.sample_tools" in error["message"]
    assert "in this worker's registry" in error["message"]
    # No tool, so no list of secrets: every argument value is hidden in the record.
    assert set(result.event["arguments"].values()) == {"***"}
    assert not path.exists()
    until(
        lambda: AsyncResult(call_id, app=celery_app).state == "FAILURE",
        timeout_s=10,
        what="Celery to record the failure",
    )


@pytest.mark.parametrize(
    "args",
    [
        ({"function": "append_line", "arguments": {"text": "x"}},),  # no call_id
        ({"call_id": "c", "function": "append_line", "arguments": "x", "evil": 1},),
        ("append_line",),
        (),
    ],
    ids=["no-call-id", "extra-field", "not-a-dict", "no-args"],
)
def test_a_body_that_is_not_a_call_message_runs_nothing_and_the_worker_goes_on(
    args: tuple[Any, ...],
    sync_worker: WorkerProcess,
    celery_app: Celery,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    path = tmp_path / "never.txt"
    for item in args:
        if isinstance(item, dict) and isinstance(item.get("arguments"), dict):
            item["arguments"]["path"] = str(path)
    task_id = str(uuid.uuid4())
    publish_raw(celery_app, task_id, args, "json")
    until(
        lambda: AsyncResult(task_id, app=celery_app).state == "FAILURE",
        timeout_s=15,
        what="the malformed message to fail",
    )
    assert not path.exists()
    # The worker is still serving calls.
    (echo,) = run_calls(celery_app, redis_client, [("echo", {"value": "alive"})], timeout_s=15)
    assert isinstance(echo, CallResult) and echo.execution["response"] == "alive"
    assert json.dumps(echo.event)  # a normal record
