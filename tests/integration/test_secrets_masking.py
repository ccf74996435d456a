"""A broker's password reaches no error, log line, record or result.

The broker is ``redis://:SECRETPASSWORD@127.0.0.1:<port>/0``: a private redis-server with
``requirepass``, either unreachable from the start or SIGKILLed while calls are in flight, each
with a monitor watching (the dispatcher publishes through kombu's producer) and without (it
publishes on its own Redis client, toolfleet.dispatcher.send.direct). The outage limit is short
(TOOLFLEET_OUTAGE_LIMIT_S), so every call ends within seconds, FAILED or ABORTED with a
BrokerError naming the broker. The password must appear in none of: the results and the text a
model is shown of them, the branch's history in memory and in Redis, the batch journal, the
session's signals, the dispatcher's log and the worker's log. The broker is named, masked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.fleet import REPO_ROOT, WorkerProcess, call, start_worker
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until, until_async
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.embedded.processes import free_port
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.liveness import MonitorWatch
from toolfleet.schemas.provider import anthropic_tool_result, openai_tool_message, result_text
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.workers.monitor import live_leases

PASSWORD = "SECRETPASSWORD"
OUTAGE_LIMIT_S = "2"
TOOLS = ("tests.support.sample_tools",)


def _url(port: int) -> str:
    return f"redis://:{PASSWORD}@127.0.0.1:{port}/0"


def _masked(port: int) -> str:
    return f"redis://:***@127.0.0.1:{port}/0"


@pytest.fixture()
def short_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFLEET_OUTAGE_LIMIT_S", OUTAGE_LIMIT_S)


@pytest.fixture()
def dispatcher_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)  # every logger of the dispatcher's process, kombu's too
    return caplog


def _believe_watched(fleet: Fleet, watched: bool) -> None:
    """Freeze the fleet's "does a monitor watch?" answer: ``False`` sends every call on the
    direct path, even after the broker is gone (the answer is never re-read)."""
    watch = MonitorWatch(fleet.keys.monitor(), clock=lambda: 0.0)
    watch.remember(watched)
    fleet.app.toolfleet_monitor_watch = watch


def _shown_to_anyone(branch: Branch, results: list[ActionResponseModel]) -> str:
    """Everything of the batch a caller, a model or an operator reading the session sees."""
    shown = [r.model_dump_json() for r in results]
    for result in results:
        shown += [result_text(result), str(openai_tool_message(result))]
        shown.append(str(anthropic_tool_result(result)))
    shown += [m.model_dump_json() for m in branch.messages]
    shown += [e.model_dump_json() for e in branch.events]
    shown += [repr(signal) for signal in branch.signals]
    return "\n".join(shown)


def _everything_in(client: redis.Redis) -> bytes:
    """Every key and value in the server (history, events, journal, records, queues)."""
    found: list[bytes] = []
    for key in client.scan_iter(count=1000):
        found.append(key)
        kind = client.type(key)
        if kind == b"string":
            found.append(client.get(key) or b"")
        elif kind == b"list":
            found += client.lrange(key, 0, -1)
        elif kind == b"hash":
            for field, value in client.hgetall(key).items():
                found += [field, value]
        elif kind == b"set":
            found += list(client.smembers(key))
        elif kind == b"zset":
            found += [member for member, _ in client.zrange(key, 0, -1, withscores=True)]
    return b"\n".join(found)


def _assert_masked(text: str, port: int, where: str) -> None:
    assert PASSWORD not in text, f"the broker password is in {where}:\n{text[-3000:]}"


@pytest.mark.parametrize("monitored", [False, True], ids=["direct", "kombu"])
def test_a_broker_unreachable_from_the_start_is_named_masked_everywhere(
    short_outage: None, dispatcher_log: pytest.LogCaptureFixture, monitored: bool
) -> None:
    port = free_port()  # nothing listens there
    url = _url(port)
    # The worker's side: `toolfleet worker` on that broker gives up with one line.
    worker_log = Path(tempfile.mkstemp(prefix="toolfleet-masking-worker-", suffix=".log")[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env.update(TOOLFLEET_BROKER_URL=url, TOOLFLEET_OUTAGE_LIMIT_S=OUTAGE_LIMIT_S)
    with worker_log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "toolfleet.cli", "worker", "--kind", "sync"],
            cwd=REPO_ROOT,
            env={**env, "PYTHONPATH": str(REPO_ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    async def scenario() -> tuple[Branch, list[ActionResponseModel]]:
        fleet = Fleet(Settings.from_env(broker_url=url, tools=TOOLS))
        _believe_watched(fleet, monitored)
        try:
            branch = Branch(fleet=fleet)
            results = await branch.act([call("echo", value=i) for i in range(3)])
            return branch, results
        finally:
            await fleet.aclose()
            fleet.close()

    try:
        branch, results = asyncio.run(asyncio.wait_for(scenario(), 60))
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
    worker_text = worker_log.read_text(errors="replace")
    worker_log.unlink()

    assert [r.status for r in results] == [EventStatus.ABORTED] * 3, results
    errors = [r.error or "" for r in results]
    assert all(e.startswith("BrokerError: ") and _masked(port) in e for e in errors), errors
    _assert_masked(_shown_to_anyone(branch, results), port, "the results or the history")
    _assert_masked(dispatcher_log.text, port, "the dispatcher's log")
    assert worker.returncode == 2 and _masked(port) in worker_text, worker_text
    _assert_masked(worker_text, port, "the worker's output")


@pytest.mark.slow
@pytest.mark.parametrize("monitored", [False, True], ids=["direct", "kombu"])
def test_a_broker_killed_mid_batch_is_named_masked_everywhere(
    short_outage: None,
    dispatcher_log: pytest.LogCaptureFixture,
    workers: list[WorkerProcess],
    monitored: bool,
) -> None:
    server = PrivateRedis(persist=True)  # comes back with what was written before the kill
    server.start()
    try:
        with server.client() as client:
            client.config_set("requirepass", PASSWORD)
        url = _url(server.port)
        worker = start_worker(
            "sync",
            redis_url=url,
            concurrency=2,
            env={"TOOLFLEET_OUTAGE_LIMIT_S": OUTAGE_LIMIT_S},
        )
        workers.append(worker)
        if monitored:
            _take_a_monitor_lease(url, worker)
        branch, results = asyncio.run(asyncio.wait_for(_kill_mid_batch(url, server, monitored), 90))
        worker_text = worker.log()
        server.start()  # what reached Redis before the kill (appendonly), no password now
        with server.client() as client:
            stored = _everything_in(client).decode(errors="replace")
    finally:
        server.kill()

    statuses = [r.status for r in results]
    assert statuses[:2] == [EventStatus.COMPLETED] * 2, results
    errors = [r.error or "" for r in results[2:]]
    assert all(e.startswith("BrokerError: ") and _masked(server.port) in e for e in errors), errors
    # Each publishing path raised its own error for the calls it could not enqueue.
    enqueue_error = "cannot enqueue calls on broker" if monitored else "could not enqueue"
    assert any(enqueue_error in e for e in errors), errors
    _assert_masked(_shown_to_anyone(branch, results), server.port, "the results or history")
    _assert_masked(dispatcher_log.text, server.port, "the dispatcher's log")
    _assert_masked(worker_text, server.port, "the worker's log")
    assert "toolfleet:batch:" in stored and "toolfleet:history:" in stored  # they were written
    _assert_masked(stored, server.port, "Redis (history, journal, records)")


def _take_a_monitor_lease(url: str, worker: WorkerProcess) -> None:
    """What Flower does: broadcast enable_events, until the worker records its lease."""
    from toolfleet.workers.app import create_app

    app = create_app(Settings(broker_url=url))
    client = redis.Redis.from_url(url)
    try:
        app.control.enable_events()
        until(
            lambda: worker.hostname in live_leases(client, Keys().monitor()),
            timeout_s=15,
            what="the worker to take the monitor lease",
        )
    finally:
        client.close()
        app.close()


def _running_calls(url: str) -> int:
    """Calls a worker has started (its C7 marker is in Redis) and not finished (no record)."""
    keys = Keys(Settings.from_env(broker_url=url).key_prefix)
    client = redis.Redis.from_url(url)
    try:
        started = [k.decode() for k in client.scan_iter(match=keys.started("*"))]
        call_ids = [key.removeprefix(keys.started("")) for key in started]
        return sum(not client.exists(keys.event(call_id)) for call_id in call_ids)
    finally:
        client.close()


async def _kill_mid_batch(
    url: str, server: PrivateRedis, monitored: bool
) -> tuple[Branch, list[ActionResponseModel]]:
    """Two echoes complete, two slow calls run, four echoes wait behind the window of two;
    the broker dies under the slow ones. The slow ones fail when the outage limit passes,
    and the waiting ones then fail to enqueue (through kombu's producer when a monitor
    watches, else on the dispatcher's own client)."""
    fleet = Fleet(Settings.from_env(broker_url=url, tools=TOOLS))
    if not monitored:
        _believe_watched(fleet, False)
    try:
        branch = Branch(fleet=fleet)
        requests: list[dict[str, Any]] = [call("echo", value=i) for i in range(2)]
        requests += [call("sleep_sync", seconds=3.0) for _ in range(2)]
        requests += [call("echo", value=i) for i in range(2, 6)]
        task = asyncio.ensure_future(branch.act(requests, call_params=CallParams(max_in_flight=2)))
        await until_async(
            lambda: len(branch.messages) >= 4,  # the echoes' pairs: the slow calls are out
            timeout_s=30,
            what="the first two echoes to complete",
            while_running=task,
        )
        await until_async(
            lambda: _running_calls(url) == 2,
            timeout_s=30,
            what="the two slow calls to start on the worker",
            while_running=task,
        )
        await asyncio.to_thread(server.kill)
        return branch, await task
    finally:
        await fleet.aclose()
        fleet.close()
