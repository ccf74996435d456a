"""Secrets: a ``secret_args`` value never appears in the history, the event
records, any Redis key other than its in-flight message, the worker or Flower logs, or Flower.

One marker value, unique to the run, goes through every path a call can take: completed on a
worker, refused by the dispatcher (wrong types, unknown tool), and stopped by the dispatcher
(a straggler past its timeout, still queued). Then everything is grepped for it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import tests.support.reliability_tools  # noqa: F401  (the dispatcher validates `search` calls)
from tests.support.fleet import WorkerProcess, call
from tests.support.flower import FlowerProcess, http_get, start_flower, stop_flower
from tests.support.waiting import until
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

MARKER = f"sk-marker-{uuid.uuid4().hex}"
TOOLS = ("tests.support.sample_tools", "tests.support.reliability_tools")


def leaks(blob: bytes | str) -> bool:
    """True if the marker is in ``blob`` as is, or inside base64 (kombu's message bodies)."""
    data = blob.encode() if isinstance(blob, str) else blob
    if MARKER.encode() in data:
        return True
    try:
        decoded: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return False
    return any(_base64_leaks(s) for s in _strings(decoded))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _base64_leaks(text: str) -> bool:
    if len(text) < 16:
        return False
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return MARKER.encode() in raw or leaks(raw)


def redis_values(client: redis.Redis, skip: set[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """Every key and each stored value of the test database, whatever the key's type."""
    for key in client.scan_iter(count=1000):
        if key in skip:
            continue
        kind = client.type(key)
        values: list[Any]
        if kind == b"string":
            values = [client.get(key)]
        elif kind == b"list":
            values = list(client.lrange(key, 0, -1))
        elif kind == b"hash":
            values = [v for pair in client.hgetall(key).items() for v in pair]
        elif kind == b"set":
            values = list(client.smembers(key))
        elif kind == b"zset":
            values = list(client.zrange(key, 0, -1))
        elif kind == b"stream":
            values = [json.dumps(e, default=str) for e in client.xrange(key)]
        else:
            values = []
        for value in values:
            if value is not None:
                yield key, value if isinstance(value, bytes) else str(value).encode()


@pytest.fixture()
def flower(redis_url: str, tmp_path: Path) -> Iterator[FlowerProcess]:
    env = {"FLOWER_UNAUTHENTICATED_API": "true", "TOOLFLEET_RESULT_BACKEND": redis_url}
    process = start_flower(redis_url, tmp_path / "flower-run", env=env)
    yield process
    stop_flower(process)


def test_a_secret_argument_appears_nowhere_but_its_in_flight_message(
    fleet_settings: Settings,
    sync_worker: WorkerProcess,
    async_worker: WorkerProcess,
    flower: FlowerProcess,
    redis_client: redis.Redis,
) -> None:
    settings = fleet_settings.model_copy(update={"tools": TOOLS})
    orphan_queue = f"toolfleet.sync.nobody-{uuid.uuid4().hex[:8]}"
    orphaned = settings.model_copy(update={"sync_queue": orphan_queue})
    # Flower hears only events sent while it listens: wait until it sees the sync worker.
    online = f'flower_worker_online{{worker="{sync_worker.hostname}"}} 1.0'
    until(
        lambda: online in http_get(flower.base_url + "/metrics", timeout_s=2.0)[1].decode(),
        timeout_s=30,
        interval_s=0.2,
        what="Flower to see the sync worker",
    )
    requests = [
        call("with_secret", query="weather", api_key=MARKER),  # runs on the worker
        call("search", query=42, api_key=MARKER),  # wrong type: refused by the dispatcher
        call("no_such_tool", api_key=MARKER),  # unknown tool: refused by the dispatcher
        call("add", a=1, b=2),
    ]

    async def scenario() -> tuple[list[Branch], list[ActionResponseModel]]:
        async with Fleet(settings) as fleet:
            branch = Branch(fleet=fleet)
            results = await branch.act(requests)
            loaded = await Branch.load(branch.id, fleet=fleet)
        async with Fleet(orphaned) as stuck:
            straggler = Branch(fleet=stuck)
            results += await straggler.act(
                call("with_secret", query="late", api_key=MARKER),
                call_params=CallParams(timeout_s=0.3),
            )
        return [branch, loaded, straggler], results

    branches, results = asyncio.run(asyncio.wait_for(scenario(), 60))

    # The calls took the paths this test means to cover.
    assert [r.status for r in results] == [
        EventStatus.COMPLETED,
        EventStatus.ABORTED,
        EventStatus.ABORTED,
        EventStatus.COMPLETED,
        EventStatus.FAILED,
    ]
    assert results[0].output == {"query": "weather", "api_key_length": len(MARKER)}
    assert results[4].error is not None and results[4].error.startswith("ToolTimeoutError")
    # Returned models, history and event records (in memory and as loaded from Redis).
    for result in results:
        assert not leaks(result.model_dump_json())
    assert results[0].arguments["api_key"] == "***"
    for branch in branches:
        assert branch.messages and branch.events
        for message in branch.messages:
            assert not leaks(message.model_dump_json())
        assert not leaks(json.dumps([e.to_dict() for e in branch.events], default=str))

    # Flower: every call it knows of, its task pages, its API, its metrics.
    call_ids = [r.call_id for r in (results[0], results[3]) if r.call_id]

    def flower_has_all() -> bool:
        for call_id in call_ids:
            status, body = http_get(f"{flower.base_url}/api/task/info/{call_id}")
            if status != 200 or json.loads(body).get("state") != "SUCCESS":
                return False
        return True

    until(flower_has_all, timeout_s=30, interval_s=0.2, what="Flower to show the calls")
    pages = ["/api/tasks", "/tasks", "/metrics", "/api/workers", "/workers"]
    pages += [f"/api/task/info/{c}" for c in call_ids] + [f"/task/{c}" for c in call_ids]
    for page in pages:
        status, body = http_get(flower.base_url + page)
        assert status == 200, (page, status)
        assert not leaks(body), f"the secret leaked into Flower's {page}"
    assert json.loads(http_get(f"{flower.base_url}/api/task/info/{call_ids[0]}")[1])["args"]

    # Logs: both workers and Flower.
    for name, log in (
        ("sync worker", sync_worker.log()),
        ("async worker", async_worker.log()),
        ("flower", flower.log()),
    ):
        assert MARKER not in log, f"the secret leaked into the {name} log"
    assert results[0].call_id is not None and results[0].call_id in sync_worker.log()

    # Redis: every key of the test DB, except the straggler's message, still queued (in flight).
    assert redis_client.llen(orphan_queue) == 1
    (in_flight,) = redis_client.lrange(orphan_queue, 0, -1)
    assert leaks(in_flight), "the in-flight message must carry the secret (the tool needs it)"
    leaked = [
        key for key, value in redis_values(redis_client, {orphan_queue.encode()}) if leaks(value)
    ]
    assert leaked == [], f"the secret leaked into Redis keys {leaked}"
    # The straggler's stored record (written by the dispatcher) is redacted too.
    assert results[4].call_id is not None
    stored = redis_client.get(Keys().event(results[4].call_id))
    assert stored is not None and b'"***"' in stored
