"""Batched calls stay visible per call (C10): a real Flower shows each call of a batch
message as its own ``tool:<function>`` task, with the call_id as task id and its own state."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from tests.support.fleet import WorkerProcess
from tests.support.flower import FlowerProcess, api, flower_fixture, wait_until_flower_watches
from tests.support.waiting import until
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.usefixtures("sync_worker")

flower = flower_fixture()

SECRET = f"sk-batch-{uuid.uuid4().hex}"
FAIL_MESSAGE = f"batch-kaboom-{uuid.uuid4().hex[:8]}"
_TIMEOUT_S = 30.0
_TERMINAL = {"SUCCESS", "FAILURE", "REVOKED"}

REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    *(("echo", {"value": i}, "SUCCESS") for i in range(6)),
    ("with_secret", {"query": "weather", "api_key": SECRET}, "SUCCESS"),
    ("fail", {"message": FAIL_MESSAGE}, "FAILURE"),
    ("slow_sync", {"seconds": 10}, "FAILURE"),
]


def test_each_call_of_a_batch_message_is_its_own_flower_task(
    flower: FlowerProcess,
    fleet_settings: Settings,
    sync_worker: WorkerProcess,
) -> None:
    wait_until_flower_watches(flower, fleet_settings, [sync_worker], _TIMEOUT_S)

    async def act() -> list[ActionResponseModel]:
        async with Fleet(fleet_settings) as fleet:
            branch = Branch(fleet=fleet)
            requests = [{"function": f, "arguments": a} for f, a, _ in REQUESTS]
            params = CallParams(bundle_size=len(REQUESTS), max_in_flight=len(REQUESTS))
            return await asyncio.wait_for(branch.act(requests, call_params=params), 60)

    results = asyncio.run(act())
    assert [r.status is EventStatus.COMPLETED for r in results] == [
        state == "SUCCESS" for _, _, state in REQUESTS
    ]

    def all_final() -> dict[str, dict[str, Any]] | None:
        tasks = {r.call_id: api(flower, f"/api/task/info/{r.call_id}") for r in results}
        done = all(t is not None and t.get("state") in _TERMINAL for t in tasks.values())
        return tasks if done else None  # type: ignore[return-value]

    tasks = until(
        all_final,
        timeout_s=_TIMEOUT_S,
        interval_s=0.2,
        what="Flower to show every call of the batch message in a final state",
    )
    for (function, _, state), result in zip(REQUESTS, results, strict=True):
        task = tasks[result.call_id or ""]
        assert task["uuid"] == result.call_id
        assert task["name"] == f"tool:{function}"
        assert task["state"] == state, (function, task)
        assert task["worker"] == sync_worker.hostname
        assert result.call_id in task["args"]
        assert SECRET not in task["args"]
        assert task["received"] and task["started"], json.dumps(task)
        if function == "fail":
            assert FAIL_MESSAGE in (task["exception"] or "")
        if function == "slow_sync":
            assert "ToolTimeoutError" in (task["exception"] or "")
    secret_task = tasks[results[6].call_id or ""]
    assert "'api_key': '***'" in secret_task["args"]
    # The batch message itself is still one Flower task too.
    listed = api(flower, "/api/tasks") or {}
    assert any(str(t["name"]).startswith("bundle:") for t in listed.values()), listed
