"""The batch journal and exactly-once durable history writes (C5)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from tests.support.command_log import CommandLog
from tests.support.fleet import WorkerProcess, call, run
from tests.support.redis_server import PrivateRedis
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.history.durable import Chunk, DurableLog, Progress
from toolfleet.dispatcher.history.journal import load_journal
from toolfleet.schemas.function_calling import REDACTED
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.wire import CallResult

SECRET = "sk-journal-secret-123"


@pytest.mark.slow
def test_the_journal_lists_every_call_before_the_first_is_enqueued_and_holds_no_secret(
    fleet_settings: Settings,
    sync_worker: WorkerProcess,
    redis_client: redis.Redis,
    redis_url: str,
    redis_db: int,
) -> None:
    keys = Keys(fleet_settings.key_prefix)

    async def scenario(fleet: Fleet) -> tuple[Branch, list[Any]]:
        branch = Branch(fleet=fleet)
        requests = [
            call("with_secret", query="q", api_key=SECRET),
            call("echo", value=1),
            call("no_such_tool", token=SECRET),
            {"not": "a request"},
        ]
        return branch, await branch.act(requests)

    # Unwatched (a lease left by an earlier monitor test would send calls through kombu's
    # path, for its task-sent event): forget the leases.
    redis_client.delete(fleet_settings.key("monitor"))
    with CommandLog(redis_url, redis_db) as log:
        branch, results = run(fleet_settings, scenario)
    record = redis_client.get(keys.event(results[1].call_id))
    assert record is not None
    batch_id = CallResult.model_validate_json(record).batch_id
    assert batch_id is not None
    # No round trip of its own: the journal rides in the first publish's pipeline, ahead of the
    # message; the server runs it first (one connection, in order), so the journal is in before
    # any call can reach a worker.
    journal_at = _first(log.commands, f"SET {keys.batch(batch_id)} ")
    listed_at = _first(log.commands, f"HSET {keys.open_batches()} {batch_id} ")
    enqueued_at = _first(log.commands, f'LPUSH {fleet_settings.sync_queue} {{"body"')
    assert journal_at < listed_at < enqueued_at, log.commands
    # ... in the same round trip: the same connection, nothing of the batch in between.
    assert log.clients[journal_at] == log.clients[listed_at] == log.clients[enqueued_at]
    loaded = asyncio.run(_load(redis_url, keys, batch_id))
    assert loaded is not None
    entry = loaded[0]
    assert entry.branch_id == branch.id and entry.strategy == "concurrent"
    assert [c.function for c in entry.calls] == ["with_secret", "echo", "no_such_tool", ""]
    assert [c.call_id for c in entry.calls] == [r.call_id for r in results]
    assert entry.calls[0].arguments == {"query": "q", "api_key": REDACTED}
    assert entry.calls[2].arguments == {"token": REDACTED}
    raw = redis_client.get(keys.batch(batch_id))
    assert raw is not None and SECRET.encode() not in raw
    # Each call's terminal record names its batch; the batch is fully written and closed.
    assert redis_client.get(keys.batch(batch_id) + ":written") == b"4"
    assert not redis_client.hexists(keys.open_batches(), batch_id)


@pytest.mark.slow
def test_a_batch_of_refused_calls_writes_its_journal_before_its_history(
    fleet_settings: Settings, redis_client: redis.Redis, redis_url: str, redis_db: int
) -> None:
    # No call is enqueued, so no publish carries the journal: the first history write sends
    # it alone, first.
    keys = Keys(fleet_settings.key_prefix)

    async def scenario(fleet: Fleet) -> tuple[Branch, list[Any]]:
        branch = Branch(fleet=fleet)
        return branch, await branch.act([call("no_such_tool", x=1), {"not": "a request"}])

    with CommandLog(redis_url, redis_db) as log:
        branch, results = run(fleet_settings, scenario)
    assert [r.error is not None for r in results] == [True, True]
    listed = [c for c in log.commands if c.startswith(f"HSET {keys.open_batches()} ")]
    assert len(listed) == 1
    batch_id = listed[0].split(" ")[2]
    listed_at = log.commands.index(listed[0])
    written_at = _first(log.commands, "EVALSHA ")
    assert listed_at < written_at, log.commands
    assert redis_client.get(keys.batch(batch_id) + ":written") == b"2"
    assert not redis_client.hexists(keys.open_batches(), batch_id)
    assert redis_client.llen(keys.events(branch.id)) == 2


def _first(commands: list[str], prefix: str) -> int:
    found = [i for i, c in enumerate(commands) if c.startswith(prefix)]
    assert found, f"no command starting {prefix!r} in {commands}"
    return found[0]


async def _load(url: str, keys: Keys, batch_id: str) -> Any:
    client = aioredis.Redis.from_url(url)
    try:
        return await load_journal(client, keys, batch_id)
    finally:
        await client.aclose()


def _chunk(n: int, before: int, key: str) -> Chunk:
    return Chunk(
        events=[json.dumps({"n": i}) for i in range(before, before + n)],
        messages=[json.dumps({"m": i}) for i in range(2 * before, 2 * (before + n))],
        units=n,
        first_call_id=None,
        progress=(key, before, before + n),
    )


def test_a_write_refused_by_a_stopped_broker_is_kept_and_written_once_in_order(
    broker: PrivateRedis,
) -> None:
    keys = Keys("durable-test")

    async def scenario() -> tuple[list[bytes], list[bytes], int]:
        client = aioredis.Redis.from_url(broker.url, socket_connect_timeout=1)
        log = DurableLog("b1")
        try:
            assert await log.write(client, keys, _chunk(2, 0, "w"), 60) is None
            await asyncio.to_thread(broker.kill)
            error = await log.write(client, keys, _chunk(3, 2, "w"), 60)
            assert error is not None and log.unwritten == 3
            assert await log.write(client, keys, _chunk(1, 5, "w"), 60) is not None
            assert log.unwritten == 4  # queued behind, in order
            await asyncio.to_thread(broker.start)
            assert await log.drain(client, keys, 60, limit_s=20) is None
            assert log.unwritten == 0
            # A chunk whose reply was lost is retried: the count shows it is in, nothing doubles.
            again = DurableLog("b1")
            assert await again.write(client, keys, _chunk(1, 5, "w"), 60) is None
            events = await client.lrange(keys.events("b1"), 0, -1)
            messages = await client.lrange(keys.history("b1"), 0, -1)
            written = int(await client.get("w") or 0)
            return events, messages, written
        finally:
            await client.aclose()

    events, messages, written = asyncio.run(asyncio.wait_for(scenario(), 60))
    # The first chunk died with the broker (no persistence); the kept ones are in, in order.
    assert [json.loads(e)["n"] for e in events] == [2, 3, 4, 5]
    assert [json.loads(m)["m"] for m in messages] == list(range(4, 12))
    assert written == 6


def test_drain_gives_up_at_the_outage_limit(broker: PrivateRedis) -> None:
    keys = Keys("durable-test")

    async def scenario() -> tuple[str | None, int]:
        client = aioredis.Redis.from_url(broker.url, socket_connect_timeout=1)
        log = DurableLog("b2")
        try:
            await asyncio.to_thread(broker.kill)
            await log.write(client, keys, _chunk(2, 0, "w2"), 60)
            error = await log.drain(client, keys, 60, limit_s=1.0)
            return error, log.unwritten
        finally:
            await client.aclose()

    error, unwritten = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert error is not None and unwritten == 2


@pytest.mark.slow
def test_the_write_that_completes_a_batch_closes_its_journal_in_the_same_script(
    fleet_settings: Settings,
    sync_worker: WorkerProcess,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No HDEL round trip of its own after the last unit; the history script that
    # writes the last unit closes the journal (only once every unit is in).
    keys = Keys(fleet_settings.key_prefix)
    closed_apart: list[str] = []

    async def close_apart(client: Any, keys_: Keys, batch_id: str) -> None:
        closed_apart.append(batch_id)

    monkeypatch.setattr("toolfleet.dispatcher.history.journal.close_journal", close_apart)

    async def scenario(fleet: Fleet) -> list[Any]:
        branch = Branch(fleet=fleet)
        return await branch.act([call("echo", value=1), call("echo", value=2)])

    results = run(fleet_settings, scenario)
    assert [r.output for r in results] == [1, 2]
    record = redis_client.get(keys.event(results[0].call_id))
    assert record is not None
    batch_id = CallResult.model_validate_json(record).batch_id
    assert batch_id is not None and redis_client.exists(keys.batch(batch_id))
    assert closed_apart == []
    assert not redis_client.hexists(keys.open_batches(), batch_id)
    assert redis_client.get(keys.batch(batch_id) + ":written") == b"2"


def test_only_the_chunk_that_completes_its_batch_closes_the_journal(
    broker: PrivateRedis,
) -> None:
    keys = Keys("durable-test")

    async def scenario() -> list[bool]:
        client = aioredis.Redis.from_url(broker.url, socket_connect_timeout=1)
        log = DurableLog("b3")
        open_key = keys.open_batches()
        seen: list[bool] = []
        try:
            await client.hset(open_key, "batch-3", "b3")
            first = _chunk(2, 0, "w3")
            assert await log.write(client, keys, first, 60) is None
            seen.append(bool(await client.hexists(open_key, "batch-3")))
            last = Chunk(
                events=['{"n": 2}'],
                messages=['{"m": 4}', '{"m": 5}'],
                units=1,
                first_call_id=None,
                progress=Progress("w3", 2, 3, (open_key, "batch-3")),
            )
            assert await log.write(client, keys, last, 60) is None
            seen.append(bool(await client.hexists(open_key, "batch-3")))
            # Re-sent after a lost reply: appends nothing, still closes (idempotent).
            await client.hset(open_key, "batch-3", "b3")
            assert await log.write(client, keys, last, 60) is None
            seen.append(bool(await client.hexists(open_key, "batch-3")))
            seen.append(await client.llen(keys.events("b3")) == 3)
            return seen
        finally:
            await client.aclose()

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == [True, False, False, True]
