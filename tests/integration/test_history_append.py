"""The history append script (C5): one command writes a whole tick of units, in order,
with its TTL, however many units there are (Lua's unpack() limit is a few thousand)."""

from __future__ import annotations

import asyncio
import json
import uuid

import redis
import redis.asyncio as aioredis

from toolfleet.dispatcher.history.history import BranchHistory, Unit, link_pair, load_records
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.record import EventRecord


def _unit(i: int, branch_id: str, with_event: bool) -> Unit:
    request, response = link_pair(
        function="echo", arguments={"value": i}, output=i, error=None, branch_id=branch_id
    )
    events = [
        EventRecord(
            id=f"event-{i}",
            execution={"status": "completed"},
            function="echo",
            arguments={"value": i},
        )
    ]
    result = ActionResponseModel(function="echo", arguments={"value": i}, output=i)
    return Unit(f"call-{i}", events if with_event else [], request, response, result)


def test_thousands_of_units_in_one_write_keep_order_and_ttl(
    redis_url: str, redis_client: redis.Redis
) -> None:
    keys = Keys(f"t16-{uuid.uuid4().hex[:8]}")
    branch_id = str(uuid.uuid4())
    # 2,500 units: 2,500 events and 5,000 messages in one call, past unpack()'s limit; every
    # third unit without an event record (a gate denial writes none).
    units = [_unit(i, branch_id, with_event=i % 3 != 0) for i in range(2_500)]

    async def scenario() -> tuple[str | None, list[object], list[EventRecord]]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            history = BranchHistory(branch_id)
            failure = await history.write(client, keys, units, record_ttl_s=120)
            messages, events = await load_records(client, keys, branch_id)
            return failure, list(messages), events
        finally:
            await client.aclose()

    failure, messages, events = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert failure is None
    assert len(messages) == 5_000
    assert [m.id for m in messages] == [m.id for u in units for m in (u.request, u.response)]
    assert [e.id for e in events] == [e.id for u in units for e in u.events]
    for key in (keys.history(branch_id), keys.events(branch_id)):
        ttl = redis_client.ttl(key)
        assert 0 < ttl <= 120, (key, ttl)
    raw = redis_client.lindex(keys.events(branch_id), 0)
    assert raw is not None and json.loads(raw)["id"] == "event-1"
    redis_client.delete(keys.history(branch_id), keys.events(branch_id))
