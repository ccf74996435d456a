"""Broker loss: Redis stopped mid-batch and started again.

The broker here is a private redis-server on a free port (the machine's Redis is never touched),
without persistence, so its restart loses every queued message, unacked delivery, started
marker and reply. The batch must still end within its deadline: each call either completed or
FAILED with an error naming the broker, and every call has its event and its linked response.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from tests.support.fleet import WorkerProcess, assert_linked_pairs, call, start_worker
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until_async
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.watch.broker_watch import BrokerWatch
from toolfleet.dispatcher.watch.collector import Collector
from toolfleet.embedded.processes import free_port
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.errors import BrokerError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus


@pytest.fixture()
def workers(broker: PrivateRedis) -> Iterator[list[WorkerProcess]]:
    env = {"TOOLFLEET_VISIBILITY_TIMEOUT_S": "5"}
    started: list[WorkerProcess] = []
    try:
        started.append(start_worker("sync", redis_url=broker.url, concurrency=2, env=env))
        started.append(start_worker("async", redis_url=broker.url, concurrency=50, env=env))
        yield started
    finally:
        for worker in started:
            worker.stop(timeout_s=5)


@pytest.mark.slow
def test_a_broker_restart_mid_batch_ends_every_call_within_the_deadline(
    broker: PrivateRedis, workers: list[WorkerProcess]
) -> None:
    settings = Settings(broker_url=broker.url, tools=("tests.support.sample_tools",))
    requests = (
        [call("echo", value=i) for i in range(4)]
        + [call("sleep_sync", seconds=0.8) for _ in range(6)]  # 2 slots: some stay queued
        + [call("sleep_async", seconds=1.0) for _ in range(4)]
    )
    deadline_s = 20.0

    async def scenario() -> tuple[Branch, list[ActionResponseModel], float]:
        fleet = Fleet(settings)
        try:
            branch = Branch(fleet=fleet)
            started = time.monotonic()
            task = asyncio.ensure_future(
                branch.act(requests, call_params=CallParams(deadline_s=deadline_s))
            )
            # Stop the broker once the echoes are in and the slow calls are in flight.
            await until_async(
                lambda: len(branch.messages) >= 8,
                timeout_s=15,
                interval_s=0.02,
                what="the echoes to complete",
                while_running=task,
            )
            await asyncio.to_thread(broker.kill)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(broker.start)
            results = await task
            return branch, results, time.monotonic() - started
        finally:
            await fleet.aclose()

    # The outer bound only catches a hang; the assertion below is the real limit.
    branch, results, elapsed_s = asyncio.run(asyncio.wait_for(scenario(), deadline_s + 20))

    assert elapsed_s < deadline_s + 3, elapsed_s
    assert len(results) == len(requests)
    assert [r.output for r in results[:4]] == [0, 1, 2, 3]
    outcomes: dict[str, int] = {}
    for result in results:
        outcomes[result.status.value] = outcomes.get(result.status.value, 0) + 1
        assert result.status in (EventStatus.COMPLETED, EventStatus.FAILED), result
        if result.status is EventStatus.FAILED:
            assert result.error is not None
            assert result.error.startswith("BrokerError: "), result.error
            assert f"127.0.0.1:{broker.port}" in result.error
    # The restart lost at least the calls still queued behind the two sync slots.
    assert outcomes.get("failed", 0) >= 1, outcomes
    # Each lost call's FAILED record is stored on the new broker, so no worker that still
    # holds its message can run it later (C7).
    with broker.client() as client:
        for result in results:
            if result.status is EventStatus.FAILED:
                assert result.call_id is not None
                stored = client.get(Keys().event(result.call_id))
                assert stored is not None and b"BrokerError" in stored, result.call_id
        # History written after the restart reached the new instance (no stale connection).
        stored_ids = {
            json.loads(raw)["id"] for raw in client.lrange(Keys().history(branch.id), 0, -1)
        }
    for i, result in enumerate(results):
        if result.status is EventStatus.FAILED:
            assert branch.messages[2 * i].id in stored_ids
            assert branch.messages[2 * i + 1].id in stored_ids
    print(f"broker restart mid-batch: {outcomes}")

    # Every call: its event record and its linked request/response pair, in input order.
    assert_linked_pairs(branch, results)
    assert [e.call_id for e in branch.events] == [r.call_id for r in results]
    for event, result in zip(branch.events, results, strict=True):
        assert event.execution["status"] == result.status.value


def test_a_broker_down_past_the_outage_limit_fails_every_awaited_call() -> None:
    """Nothing listens on the port: after the outage limit of failed checks, every awaited call
    ends with a BrokerError naming the broker instead of waiting forever."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    now = [1000.0]

    async def scenario() -> tuple[BaseException | None, int]:
        collector = Collector(
            aioredis.Redis.from_url(url), "toolfleet:reply:test-outage", Keys().event
        )
        watch = BrokerWatch(
            aioredis.Redis.from_url(url), collector, Keys(), url, clock=lambda: now[0]
        )
        future = collector.expect("call-1", 0)
        try:
            await watch.check()  # first failure: the outage starts
            assert not future.done()
            now[0] += Settings().outage_limit_s + 1
            await watch.check()
            return future.exception(), len(collector.awaited())
        finally:
            await watch.aclose()
            await collector.aclose()

    error, still_awaited = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert isinstance(error, BrokerError)
    assert f"127.0.0.1:{port}" in str(error) and "unreachable" in str(error)
    assert still_awaited == 0
