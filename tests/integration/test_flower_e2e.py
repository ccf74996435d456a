"""Flower shows every call truthfully (C10): a real Flower, real workers, Branch.act.

One batch with sync and async successes, failures, timeouts and a secret argument runs
through ``Branch.act`` while ``toolfleet flower`` watches the test Redis; Flower's API, pages
and ``/metrics`` are then checked call by call.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.fleet import WorkerProcess
from tests.support.flower import (
    FLOWER_EVENTS_TIMEOUT_S,
    FlowerProcess,
    api,
    flower_fixture,
    http_get,
    parse_metrics,
    start_flower,
    stop_flower,
    wait_until_flower_watches,
)
from tests.support.waiting import until, until_async
from toolfleet.cli.flower import STATE_FILE_NAME
from toolfleet.dispatcher import Branch, Fleet, HookPoint
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.usefixtures("sync_worker", "async_worker")

# Unique per run, so finding it anywhere proves a leak rather than a coincidence.
SECRET = f"sk-secret-{uuid.uuid4().hex}"
FAIL_MESSAGE = f"kaboom-{uuid.uuid4().hex[:8]}"
_TERMINAL_STATES = {"SUCCESS", "FAILURE", "REVOKED"}


@dataclass(frozen=True)
class Expected:
    function: str
    arguments: dict[str, Any]
    kind: str  # which worker runs it
    state: str
    exception: tuple[str, ...] = ()  # substrings of Flower's exception text


BATCH = [
    Expected("add", {"a": 2, "b": 3}, "sync", "SUCCESS"),
    Expected("sleep_async", {"seconds": 0.05}, "async", "SUCCESS"),
    Expected("with_secret", {"query": "weather", "api_key": SECRET}, "sync", "SUCCESS"),
    Expected("fail", {"message": FAIL_MESSAGE}, "sync", "FAILURE", ("ValueError", FAIL_MESSAGE)),
    Expected(
        "fail_async", {"message": FAIL_MESSAGE}, "async", "FAILURE", ("ValueError", FAIL_MESSAGE)
    ),
    Expected("slow_sync", {"seconds": 10}, "sync", "FAILURE", ("ToolTimeoutError", "slow_sync")),
    Expected("slow_async", {"seconds": 10}, "async", "FAILURE", ("ToolTimeoutError", "slow_async")),
]


@dataclass
class Observed:
    """The batch's results, and Flower's view of each call once it reached a final state."""

    flower: FlowerProcess
    results: list[ActionResponseModel]
    branch_id: str
    tasks: dict[str, dict[str, Any]]  # call_id → /api/task/info/<call_id>
    workers: dict[str, WorkerProcess]


flower = flower_fixture()


@pytest.fixture(scope="module")
def observed(
    flower: FlowerProcess,
    fleet_settings: Settings,
    sync_worker: WorkerProcess,
    async_worker: WorkerProcess,
) -> Observed:
    workers = {"sync": sync_worker, "async": async_worker}
    wait_until_flower_watches(flower, fleet_settings, list(workers.values()))

    async def act() -> tuple[str, list[ActionResponseModel]]:
        async with Fleet(fleet_settings) as fleet:
            branch = Branch(fleet=fleet)
            requests = [{"function": e.function, "arguments": e.arguments} for e in BATCH]
            return branch.id, await asyncio.wait_for(branch.act(requests), 60)

    branch_id, results = asyncio.run(act())
    call_ids = [r.call_id for r in results]
    assert all(call_ids), results

    def all_final() -> dict[str, dict[str, Any]] | None:
        tasks = {cid: api(flower, f"/api/task/info/{cid}") for cid in call_ids if cid}
        done = all(t is not None and t.get("state") in _TERMINAL_STATES for t in tasks.values())
        return {k: v for k, v in tasks.items() if v is not None} if done else None

    tasks = until(
        all_final,
        timeout_s=FLOWER_EVENTS_TIMEOUT_S,
        interval_s=0.2,
        what="Flower to show every call of the batch in a final state",
    )
    return Observed(flower, results, branch_id, tasks, workers)


def test_the_batch_itself_ran_as_expected(observed: Observed) -> None:
    assert [r.function for r in observed.results] == [e.function for e in BATCH]
    for expected, result in zip(BATCH, observed.results, strict=True):
        want = EventStatus.COMPLETED if expected.state == "SUCCESS" else EventStatus.FAILED
        assert result.status is want, (expected.function, result)


@pytest.mark.parametrize("index", range(len(BATCH)), ids=[e.function for e in BATCH])
def test_each_call_is_its_own_flower_task(observed: Observed, index: int) -> None:
    expected, result = BATCH[index], observed.results[index]
    assert result.call_id is not None
    task = observed.tasks[result.call_id]

    assert task["uuid"] == result.call_id
    assert task["name"] == f"tool:{expected.function}"
    # C10: the Flower state mirrors the event status.
    assert task["state"] == expected.state
    assert task["worker"] == observed.workers[expected.kind].hostname
    assert observed.branch_id in task["args"]
    assert result.call_id in task["args"]
    assert task["received"] and task["started"]

    assert task["runtime"] is not None and task["runtime"] > 0
    if expected.function.startswith("slow_"):
        assert task["runtime"] >= 0.4  # stopped by its 0.5 s timeout, not before
    if expected.state == "SUCCESS":
        assert task["exception"] is None
        assert task["succeeded"] >= task["started"]
    else:
        for text in expected.exception:
            assert text in (task["exception"] or ""), task["exception"]
        assert task["failed"] >= task["started"]
        # The event record the dispatcher got carries the same error.
        assert result.error is not None and expected.exception[0] in result.error


def test_the_task_list_names_every_call(observed: Observed) -> None:
    listed = api(observed.flower, "/api/tasks")
    assert listed is not None
    for expected, result in zip(BATCH, observed.results, strict=True):
        assert result.call_id in listed
        entry = listed[result.call_id]
        assert entry["name"] == f"tool:{expected.function}"
        assert entry["state"] == expected.state
    by_name = api(observed.flower, "/api/tasks?taskname=tool:with_secret")
    assert by_name is not None
    assert observed.results[2].call_id in by_name


def test_secret_arguments_are_shown_redacted_and_never_in_clear(observed: Observed) -> None:
    secret_call = observed.results[2]
    assert secret_call.call_id is not None
    task = observed.tasks[secret_call.call_id]
    assert "'api_key': '***'" in task["args"]
    assert "'query': 'weather'" in task["args"]

    call_ids = [r.call_id for r in observed.results]
    bodies = {
        path: http_get(observed.flower.base_url + path)
        for path in [
            "/api/tasks",
            "/api/tasks?taskname=tool:with_secret",
            f"/api/tasks?search={SECRET}",
            "/api/workers?refresh=1",
            "/tasks",
            "/tasks/datatable?draw=1&start=0&length=100&search[value]=&order[0][column]=0"
            "&order[0][dir]=asc&columns[0][data]=name",
            "/metrics",
            *(f"/api/task/info/{cid}" for cid in call_ids),
            *(f"/task/{cid}" for cid in call_ids),
            *(f"/api/task/result/{cid}" for cid in call_ids),
        ]
    }
    for path, (status, body) in bodies.items():
        assert status == 200, f"{path} answered {status}"
        assert SECRET.encode() not in body, f"the secret appears in Flower's {path}"
    # The task page did render the call (so the check above looked at real content).
    status, page = http_get(f"{observed.flower.base_url}/task/{secret_call.call_id}")
    assert b"tool:with_secret" in page and b"***" in page
    stored = api(observed.flower, f"/api/task/result/{secret_call.call_id}")
    assert stored["state"] == "SUCCESS"
    assert stored["result"]["call_id"] == secret_call.call_id
    assert stored["result"]["event"]["arguments"]["api_key"] == "***"

    for worker in observed.workers.values():
        assert SECRET not in worker.log(), f"the secret appears in {worker.hostname}'s log"


def test_metrics_count_the_calls(observed: Observed) -> None:
    status, body = http_get(observed.flower.base_url + "/metrics")
    assert status == 200
    metrics = parse_metrics(body.decode())

    for expected in BATCH:
        worker = observed.workers[expected.kind].hostname
        name = f"tool:{expected.function}"
        final_type = "task-succeeded" if expected.state == "SUCCESS" else "task-failed"
        for event_type in ("task-received", "task-started", final_type):
            labels = (("task", name), ("type", event_type), ("worker", worker))
            assert metrics.get(("flower_events_total", labels), 0) >= 1, (name, event_type)
    # Every task Flower lists as succeeded or failed is counted once by its metrics.
    listed = api(observed.flower, "/api/tasks") or {}
    for state, event_type in (("SUCCESS", "task-succeeded"), ("FAILURE", "task-failed")):
        in_list = sum(1 for t in listed.values() if t["state"] == state)
        counted = sum(
            value
            for (metric, labels), value in metrics.items()
            if metric == "flower_events_total" and ("type", event_type) in labels
        )
        assert counted == in_list, (state, counted, in_list)
    runtime_count = sum(
        value
        for (metric, labels), value in metrics.items()
        if metric == "flower_task_runtime_seconds_count" and ("task", "tool:add") in labels
    )
    assert runtime_count >= 1


def test_a_cancelled_call_is_revoked_in_flower(
    flower: FlowerProcess, fleet_settings: Settings, async_worker: WorkerProcess
) -> None:
    """C9/C10: cancelling act() cancels the running async call; Flower shows REVOKED."""
    started: list[str] = []

    async def act_then_cancel() -> str:
        async with Fleet(fleet_settings) as fleet:
            branch = Branch(fleet=fleet)
            branch.hooks.on(HookPoint.TOOL_PRE, lambda payload: started.append(payload["call_id"]))
            act = asyncio.create_task(
                branch.act([{"function": "sleep_async", "arguments": {"seconds": 60}}])
            )
            call_id = await until_async(
                lambda: started[0] if started else None,
                timeout_s=FLOWER_EVENTS_TIMEOUT_S,
                what="TOOL_PRE",
            )
            # Cancel only once the worker runs it, so this is the running-call path.
            await until_async(
                lambda: asyncio.to_thread(lambda: _state(flower, call_id) == "STARTED"),
                timeout_s=FLOWER_EVENTS_TIMEOUT_S,
                what="Flower to show the call STARTED",
            )
            act.cancel()
            with pytest.raises(asyncio.CancelledError):
                await act
            return call_id

    call_id = asyncio.run(act_then_cancel())
    until(
        lambda: _state(flower, call_id) == "REVOKED",
        timeout_s=FLOWER_EVENTS_TIMEOUT_S,
        interval_s=0.2,
        what=f"Flower to show call {call_id} REVOKED",
    )
    task = api(flower, f"/api/task/info/{call_id}")
    assert task["name"] == "tool:sleep_async"
    assert task["worker"] == async_worker.hostname


def _state(flower: FlowerProcess, call_id: str) -> str | None:
    task = api(flower, f"/api/task/info/{call_id}")
    return None if task is None else str(task.get("state"))


def test_zz_state_persists_across_a_restart_without_the_secret(
    observed: Observed, redis_url: str
) -> None:
    """Last in this module: it stops the module's Flower (its state file is saved on SIGTERM)."""
    stop_flower(observed.flower)
    assert observed.flower.proc.returncode == 0, observed.flower.log()
    run_dir = observed.flower.log_path.parent
    state_files = list(run_dir.glob(STATE_FILE_NAME + "*"))
    assert state_files
    for path in state_files:
        assert SECRET.encode() not in path.read_bytes(), f"the secret is in {path.name}"

    restarted = start_flower(redis_url, run_dir, env={"FLOWER_UNAUTHENTICATED_API": "true"})
    try:
        for expected, result in zip(BATCH, observed.results, strict=True):
            task = api(restarted, f"/api/task/info/{result.call_id}")
            assert task is not None, f"{expected.function} was forgotten across the restart"
            assert task["name"] == f"tool:{expected.function}"
            assert task["state"] == expected.state
    finally:
        stop_flower(restarted)
