"""Redelivery without duplicates (C7: call_id is the idempotency key).

A finished call's message delivered again, whether re-published through kombu or redelivered
because its worker died after the tool finished but before the ack, returns the stored record
and does not run the tool again: the file has one line, the history one response.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

from kombu import Connection, Exchange, Producer

from tests.support.fleet import WorkerProcess, call, start_worker
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until, until_async
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.messages import ActionRequest, ActionResponse
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallMessage, CallResult
from toolfleet.workers.app import EXECUTE_TASK, create_app

TOOLS = ("tests.support.sample_tools", "tests.support.reliability_tools")
ENV = {"TOOLFLEET_VISIBILITY_TIMEOUT_S": "2"}


def assert_one_response(branch: Branch, result: ActionResponseModel, broker: PrivateRedis) -> None:
    request, response = branch.messages
    assert isinstance(request, ActionRequest) and isinstance(response, ActionResponse)
    assert response.content.action_request_id == request.id
    assert response.content.output == result.output
    with broker.client() as client:
        stored = client.lrange(Keys().history(branch.id), 0, -1)
    assert [json.loads(raw)["role"] for raw in stored] == ["action_request", "action_response"]


def test_a_message_published_twice_through_kombu_runs_its_tool_once(
    broker: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    workers.append(start_worker("sync", redis_url=broker.url, concurrency=2, tools=TOOLS))
    settings = Settings(broker_url=broker.url, tools=TOOLS)
    path = tmp_path / "once.txt"
    replay_reply = f"toolfleet:reply:test-replay-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[Branch, ActionResponseModel]:
        async with Fleet(settings) as fleet:
            branch = Branch(fleet=fleet)
            (result,) = await branch.act(call("append_line", path=str(path), text="x"))
            return branch, result

    branch, result = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert result.status is EventStatus.COMPLETED and result.output == 1
    assert result.call_id is not None

    # The same call, delivered again: same call_id, same task id, straight through kombu.
    message = CallMessage(
        call_id=result.call_id,
        branch_id=branch.id,
        function="append_line",
        arguments={"path": str(path), "text": "x"},
        reply_to=replay_reply,
    )
    queue = settings.sync_queue
    with Connection(broker.url) as conn:
        app = create_app(settings)
        try:
            task_message = app.amqp.as_task_v2(
                message.call_id, EXECUTE_TASK, args=(message.model_dump(mode="json"),)
            )
        finally:
            app.close()
        Producer(conn).publish(
            task_message.body,
            serializer="json",
            headers=task_message.headers,
            exchange=Exchange(queue, type="direct"),
            routing_key=queue,
            declare=[],
            **task_message.properties,
        )
    with broker.client() as client:
        popped: Any = until(
            lambda: client.lpop(replay_reply), timeout_s=15, what="the replayed call's reply"
        )
        stored = client.get(Keys().event(result.call_id))
    replayed = CallResult.model_validate_json(popped)
    # The stored record, not a new run: same event id, same output, and one line in the file.
    assert stored is not None
    assert replayed.event["id"] == CallResult.model_validate_json(stored).event["id"]
    assert replayed.event["id"] == branch.events[0].id
    assert replayed.execution["response"] == 1
    assert path.read_text() == "x\n"
    assert_one_response(branch, result, broker)


def test_a_worker_killed_after_the_tool_finished_but_before_the_ack_does_not_rerun_it(
    broker: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    doomed = start_worker("sync", redis_url=broker.url, concurrency=1, tools=TOOLS, env=ENV)
    workers.append(doomed)
    settings = Settings(broker_url=broker.url, tools=TOOLS)
    path = tmp_path / "finished.txt"

    async def scenario() -> tuple[Branch, ActionResponseModel]:
        async with Fleet(settings) as fleet:
            branch = Branch(fleet=fleet)
            task = asyncio.ensure_future(
                branch.act(call("sleep_then_mark", path=str(path), seconds=1.0))
            )
            client = fleet.redis
            keys = Keys()
            await until_async(
                lambda: client.keys(keys.started("*")),
                timeout_s=15,
                interval_s=0.02,
                what="the call to start",
            )
            # Freeze the worker's main process: its child finishes the call and stores the
            # record, but the ack (sent by the main process) never happens.
            os.kill(doomed.pid, signal.SIGSTOP)
            (result,) = await task
            return branch, result

    branch, result = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert result.status is EventStatus.COMPLETED and result.output == 1
    assert result.call_id is not None
    with broker.client() as client:
        # The delivery is still unacked: Redis will hand it to another worker.
        assert client.hlen("unacked") == 1

    survivor = start_worker("sync", redis_url=broker.url, concurrency=1, tools=TOOLS, env=ENV)
    workers.append(survivor)
    doomed.kill()  # SIGKILL of the whole (frozen) worker: the unacked message is orphaned

    until(
        lambda: f"[{result.call_id}] succeeded" in survivor.log(),
        timeout_s=20,
        what="the survivor to receive the redelivered message",
    )
    assert f"[{result.call_id}] received" in survivor.log()
    with broker.client() as client:
        until(lambda: client.hlen("unacked") == 0, timeout_s=5, what="the redelivery ack")
        stored = client.get(Keys().event(result.call_id))
    assert stored is not None
    record = CallResult.model_validate_json(stored)
    assert record.worker == doomed.hostname  # the first run's record still stands
    assert record.event["id"] == branch.events[0].id
    assert len(path.read_text().splitlines()) == 1  # the tool ran once
    assert_one_response(branch, result, broker)
