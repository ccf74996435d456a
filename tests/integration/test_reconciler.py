"""Lost messages: a call whose message vanished is republished once from the
dispatcher's copy; lost again, it fails CallLostError naming where it was last seen.

The loss is made by hand: a call queued behind a busy one-slot worker has its message removed
from the Redis list, the same end state as a worker killed between popping a message and
recording it in ``unacked`` (kombu #305/#1836).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time

import pytest
import redis

from tests.support.fleet import WorkerProcess, assert_linked_pairs, call, run
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.watch.whereabouts import call_ids_of
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus


def _message(task_id: str, task: str = "toolfleet.execute", body: object = None) -> bytes:
    encoded = base64.b64encode(json.dumps(body or [[], {}, {}]).encode()).decode()
    return json.dumps(
        {
            "body": encoded,
            "headers": {"id": task_id, "task": task},
            "properties": {"body_encoding": "base64"},
        }
    ).encode()


def test_call_ids_of_reads_task_ids_batches_and_unacked_entries() -> None:
    assert call_ids_of(_message("c1")) == {"c1"}
    assert call_ids_of(_message("c1.2")) == {"c1"}  # a retry's task id
    batch = [[[{"call_id": "a"}, {"call_id": "b"}]], {}, {}]
    assert call_ids_of(_message("batch-x", "toolfleet.execute_many", batch)) >= {"a", "b"}
    unacked = json.dumps([json.loads(_message("c2")), "exchange", "key"])
    assert call_ids_of(unacked) == {"c2"}
    assert call_ids_of(b"not json") == set()


def _remover(
    client: redis.Redis, queue: str, value: int, stop: threading.Event, times: int
) -> list[str]:
    """Remove the queued message of ``echo(value=value)`` up to ``times`` times."""
    removed: list[str] = []

    def loop() -> None:
        while not stop.is_set() and len(removed) < times:
            for raw in client.lrange(queue, 0, -1):
                headers = json.loads(raw).get("headers", {})
                if f"'value': {value}" in str(headers.get("argsrepr")):
                    if client.lrem(queue, 1, raw):
                        removed.append(next(iter(call_ids_of(raw))))
            time.sleep(0.01)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return removed


def _act(
    settings: Settings, client: redis.Redis, times: int
) -> tuple[Branch, list[ActionResponseModel], list[str]]:
    stop = threading.Event()
    removed = _remover(client, settings.sync_queue, 7, stop, times)

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        # The one-slot worker is busy for 4 s: the echoes wait in the queue meanwhile.
        requests = [call("sleep_sync", seconds=4), call("echo", value=7), call("echo", value=8)]
        return branch, await branch.act(requests)

    try:
        branch, results = run(settings, scenario, timeout_s=60)
    finally:
        stop.set()
    return branch, results, removed


@pytest.mark.slow
def test_a_lost_message_is_republished_once_and_the_call_completes(
    lone_sync: tuple[Settings, WorkerProcess],
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = lone_sync[0].model_copy(update={"reconcile_grace_s": 0.5})
    with caplog.at_level(logging.WARNING, logger="toolfleet.dispatcher.watch.reconciler"):
        branch, results, removed = _act(settings, redis_client, times=1)
    assert len(removed) == 1
    assert [r.status for r in results] == [EventStatus.COMPLETED] * 3
    assert results[1].output == 7 and results[1].call_id == removed[0]
    assert any("republishing" in r.getMessage() for r in caplog.records)
    assert_linked_pairs(branch, results)


@pytest.mark.slow
def test_a_message_lost_twice_fails_call_lost_error_naming_where_last_seen(
    lone_sync: tuple[Settings, WorkerProcess], redis_client: redis.Redis
) -> None:
    settings = lone_sync[0].model_copy(update={"reconcile_grace_s": 0.5})
    started = time.monotonic()
    branch, results, removed = _act(settings, redis_client, times=2)
    assert time.monotonic() - started < 30
    assert len(removed) == 2 and removed[0] == removed[1]
    busy, lost, other = results
    assert busy.status is EventStatus.COMPLETED and other.status is EventStatus.COMPLETED
    assert lost.status is EventStatus.FAILED
    assert lost.error is not None and lost.error.startswith("CallLostError")
    assert f"never seen since it was published to queue {settings.sync_queue!r}" in lost.error
    assert_linked_pairs(branch, results)


def test_the_reconciler_stops_with_its_fleet() -> None:
    async def scenario() -> None:
        fleet = Fleet(Settings(broker_url="redis://127.0.0.1:1/0"))
        assert fleet.reconciler.tracked == 0
        await asyncio.wait_for(fleet.aclose(), 5)

    asyncio.run(scenario())


def test_locate_tells_queued_reserved_started_finished_and_nowhere(
    redis_url: str, redis_client: redis.Redis
) -> None:
    import uuid

    import redis.asyncio as aioredis

    from toolfleet.dispatcher.infra.kombu_internals import UNACKED_KEY
    from toolfleet.dispatcher.watch.whereabouts import Place, locate
    from toolfleet.schemas.keys import Keys
    from toolfleet.workers.store import StartedMarker

    keys = Keys(f"test-{uuid.uuid4().hex[:8]}")
    queue = f"{keys.prefix}.queue"
    ids = {place: f"{place}-{uuid.uuid4().hex[:8]}" for place in ("q", "r", "s", "f", "n", "d")}
    redis_client.rpush(queue, _message(ids["q"]))
    tag = uuid.uuid4().hex
    redis_client.hset(UNACKED_KEY, tag, json.dumps([json.loads(_message(ids["r"])), "", ""]))
    redis_client.set(keys.started(ids["s"]), StartedMarker.now("w1@host", 0).to_json())
    redis_client.set(keys.event(ids["f"]), b"{}")
    # Started by a worker whose heartbeat stopped long ago, its message gone: nobody will
    # finish it, so it counts as nowhere (the reconciler republishes it).
    live = StartedMarker.now("w2@host", 0)
    dead = StartedMarker(worker=live.worker, pid=live.pid, attempt=0, beat_at=live.beat_at - 600)
    redis_client.set(keys.started(ids["d"]), dead.to_json())
    try:

        async def look() -> dict[str, str]:
            client = aioredis.Redis.from_url(redis_url)
            try:
                found = await locate(client, keys, list(ids.values()), [queue])
            finally:
                await client.aclose()
            return {call_id: sighting.place for call_id, sighting in found.items()}

        places = asyncio.run(look())
    finally:
        redis_client.hdel(UNACKED_KEY, tag)
        redis_client.delete(
            queue, keys.started(ids["s"]), keys.started(ids["d"]), keys.event(ids["f"])
        )
    assert places == {
        ids["q"]: Place.QUEUED,
        ids["r"]: Place.RESERVED,
        ids["s"]: Place.STARTED,
        ids["f"]: Place.FINISHED,
        ids["n"]: Place.NOWHERE,
        ids["d"]: Place.NOWHERE,
    }
