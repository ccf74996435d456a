"""Flower on a fleet behind Redis Sentinel, with real processes: a primary, a replica, three
sentinels, a ``toolfleet worker`` and ``toolfleet flower``, all given only the sentinels' URL
and the primary's name.

Flower shows each call under its tool name, and its queue lengths answer, while the first
sentinel of the URL is down (Flower alone would ask only that one) and after the primary's
machine is lost and the sentinels promote the replica: Flower follows without a restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fleet import WorkerProcess, run, start_worker
from tests.support.flower import (
    FLOWER_EVENTS_TIMEOUT_S,
    FlowerProcess,
    api,
    start_flower,
    stop_flower,
    wait_until_flower_watches,
)
from tests.support.sentinel_cluster import MASTER, SentinelCluster
from tests.support.waiting import until
from toolfleet import ActionResponseModel, Branch, EventStatus, Fleet
from toolfleet.schemas.settings import Settings

TOOLS = ("tests.support.sample_tools",)


@pytest.fixture(scope="module")
def watched(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SentinelCluster, Settings, FlowerProcess]]:
    """The cluster, a sync worker on it, and ``toolfleet flower`` watching it."""
    cluster = SentinelCluster().start()
    env = {"TOOLFLEET_SENTINEL_MASTER": MASTER}
    worker: WorkerProcess | None = None
    flower: FlowerProcess | None = None
    try:
        worker = start_worker("sync", redis_url=cluster.url, env=env, concurrency=2, tools=TOOLS)
        settings = Settings(broker_url=cluster.url, sentinel_master=MASTER, tools=TOOLS)
        flower_env = {**env, "FLOWER_UNAUTHENTICATED_API": "true"}
        run_dir = tmp_path_factory.mktemp("flower-sentinel")
        flower = start_flower(cluster.url, run_dir, env=flower_env)
        wait_until_flower_watches(flower, settings, [worker])
        yield cluster, settings, flower
    finally:
        if flower is not None:
            stop_flower(flower)
        if worker is not None:
            worker.stop(timeout_s=10)
        cluster.stop()


def _act_and_see(settings: Settings, flower: FlowerProcess, a: int) -> None:
    """One ``add`` call acted on the fleet completes, and Flower shows it as ``tool:add``
    in SUCCESS, with the queue lengths answering."""

    async def scenario(fleet: Fleet) -> ActionResponseModel:
        [result] = await Branch(fleet=fleet).act(
            [{"function": "add", "arguments": {"a": a, "b": 1}}]
        )
        return result

    result = run(settings, scenario)
    assert result.status is EventStatus.COMPLETED and result.output == a + 1

    def shown() -> dict[str, Any] | None:
        task = api(flower, f"/api/task/info/{result.call_id}")
        return task if task is not None and task.get("state") == "SUCCESS" else None

    task = until(shown, timeout_s=FLOWER_EVENTS_TIMEOUT_S, interval_s=0.1, what="the call shown")
    assert task["name"] == "tool:add"
    lengths = api(flower, "/api/queues/length")["active_queues"]
    assert lengths and all(isinstance(q["messages"], int) and q["messages"] >= 0 for q in lengths)


def test_flower_follows_a_sentinel_fleet_with_its_first_sentinel_down_and_through_a_failover(
    watched: tuple[SentinelCluster, Settings, FlowerProcess],
) -> None:
    cluster, settings, flower = watched
    _act_and_see(settings, flower, 1)

    # The URL's first sentinel is lost: the others name the primary.
    cluster.sentinels[0].kill()
    _act_and_see(settings, flower, 2)

    # The primary's machine is lost too: the two live sentinels promote the replica, and the
    # worker, the dispatcher and Flower follow without a restart.
    old = cluster.kill_primary()
    cluster.wait_for_failover(old.port)
    _act_and_see(settings, flower, 3)
