"""Chaos (C7: nothing lost, nothing run twice): a network partition between hosts, with a real
network.

Two sync workers, each in a network namespace of its own (``ip netns`` + a veth pair), reach a
private redis-server over their veth (it listens on the host ends). A batch fans out to both
(the records and a real ``toolfleet flower`` show both hostnames);
mid-batch the test takes host A's link down (``ip link set … down``), keeps it down past the
visibility timeout and the heartbeat's stale limit, and brings it back. A's running calls
follow the worker-lost rules (non-idempotent: FAILED WorkerLostError, never re-run), its
unstarted calls run on host B, act() returns, nothing is lost or run twice.

Root only: skipped, with the reason, where network namespaces cannot be made.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.chaos_support import (
    CHAOS_TOOLS,
    Ledger,
    act_through,
    chaos_calls,
    chaos_settings,
    judge,
    stored_branch,
)
from tests.support.fleet import WorkerProcess, start_worker
from tests.support.flower import FlowerProcess, http_get, start_flower, stop_flower
from tests.support.netns import Host, host_pair
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until, until_async
from toolfleet.dispatcher import Branch
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.settings import Settings
from toolfleet.workers.monitor import live_leases

pytestmark = pytest.mark.chaos

# A partitioned worker's reserved calls go back to the queue after this long ...
VISIBILITY_TIMEOUT_S = 4.0
# ... and its running calls are judged lost once its heartbeat is older than 8 s
# (toolfleet.workers.store.HEARTBEAT_STALE_S): the partition outlasts both.
PARTITION_S = 15.0


@pytest.fixture()
def hosts() -> Iterator[tuple[Host, Host]]:
    with host_pair("10.213", "10.214") as pair:
        yield pair


def test_a_partitioned_host_loses_nothing_and_runs_nothing_twice(
    hosts: tuple[Host, Host], tmp_path: Path
) -> None:
    a, b = hosts
    broker = PrivateRedis(persist=False, also_bind=(a.outer_ip, b.outer_ip))
    broker.start()
    workers: list[WorkerProcess] = []
    flower: FlowerProcess | None = None
    try:
        for host, name in ((a, "a"), (b, "b")):
            workers.append(
                start_worker(
                    "sync",
                    redis_url=f"redis://{host.outer_ip}:{broker.port}/0",
                    tools=CHAOS_TOOLS,
                    concurrency=2,
                    hostname=f"partition-{name}@{host.netns}",
                    env={
                        "TOOLFLEET_VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S),
                        "CHAOS_HOST": name,
                    },
                    prefix=("ip", "netns", "exec", host.netns),
                )
            )
        flower = start_flower(
            broker.url, tmp_path / "flower", env={"FLOWER_UNAUTHENTICATED_API": "true"}
        )
        _wait_for_task_events(broker.url, workers)
        call_ids = _partition_run(broker, a, workers, tmp_path)
        _assert_flower_shows_both_hosts(flower, workers, call_ids)
    finally:
        a.restore()
        if flower is not None:
            stop_flower(flower)
        for worker in workers:
            worker.stop(timeout_s=5)
        broker.kill()


def _wait_for_task_events(broker_url: str, workers: list[WorkerProcess]) -> None:
    """Until both workers hold Flower's task-event lease: calls before it never reach Flower."""
    import redis

    client = redis.Redis.from_url(broker_url)
    try:
        key = Settings(broker_url=broker_url).key("monitor")
        until(
            lambda: {w.hostname for w in workers} <= set(live_leases(client, key)),
            timeout_s=30,
            interval_s=0.25,
            what="both hosts' workers to hold Flower's task-event lease",
        )
    finally:
        client.close()


def _assert_flower_shows_both_hosts(
    flower: FlowerProcess, workers: list[WorkerProcess], call_ids: set[str]
) -> None:
    def hosts_in_flower() -> set[str] | None:
        status, body = http_get(flower.base_url + "/api/tasks")
        assert status == 200, body
        shown = {t.get("worker") for cid, t in json.loads(body).items() if cid in call_ids}
        wanted = {w.hostname for w in workers}
        return shown if wanted <= shown else None

    until(hosts_in_flower, timeout_s=30, interval_s=0.5, what="Flower to show both hosts")


def _partition_run(
    broker: PrivateRedis, a: Host, workers: list[WorkerProcess], tmp_path: Path
) -> set[str]:
    ledger = Ledger(tmp_path)
    n = 40
    requests = chaos_calls(ledger, ("chaos_sync",), n, lambda i: 0.8 + (i % 3) / 10)
    settings = chaos_settings(broker)
    window: list[int] = []  # ledger lines before the cut, before the restore

    def running_on_a() -> bool:
        marks = ledger.marks()
        return any(
            host == "a" and phase == "S" and "E" not in marks[token]
            for phase, token, _, host in ledger.lines()
        )

    async def partition(branch: Branch, task: asyncio.Future[list[ActionResponseModel]]) -> None:
        await until_async(
            lambda: ledger.count("E") >= n // 4 and running_on_a(),
            timeout_s=90,
            what="a quarter of the calls, with one running on host A",
            while_running=task,
        )
        a.cut()
        window.append(len(ledger.lines()))
        await asyncio.sleep(PARTITION_S)
        window.append(len(ledger.lines()))
        a.restore()

    limit_s = 180.0
    branch_id, results, elapsed_s = asyncio.run(
        act_through(settings, requests, partition, limit_s=limit_s)
    )
    stored = asyncio.run(stored_branch(settings, branch_id))
    verdict = judge(requests, results, stored, ledger)
    lines = ledger.lines()
    print(json.dumps({"chaos": "netns-partition", "partition_s": PARTITION_S,
                      "elapsed_s": round(elapsed_s, 1), **verdict.summary()}))  # fmt: skip
    assert elapsed_s < limit_s
    verdict.assert_clean()
    # The batch fanned out to both hosts: records name both workers, both ran calls.
    hostnames = {e.worker for e in stored.events}
    assert {w.hostname for w in workers} <= hostnames, hostnames
    before = lines[: window[0]]
    assert {host for _, _, _, host in before} == {"a", "b"}
    # While A was cut off, only B started calls; the rest of the batch ran there.
    during = lines[window[0] : window[1]]
    assert during and all(host == "b" for phase, _, _, host in during if phase == "S"), during
    # A's calls cut off mid-run ended by the worker-lost rules: FAILED WorkerLostError (not
    # idempotent, so never re-run) or COMPLETED once A could record again — never both.
    cut_short = {t for p, t, _, h in before if p == "S" and h == "a"} - {
        t for p, t, _, h in before if p == "E"
    }
    assert cut_short, "no call was running on host A when its link went down"
    for token in cut_short:
        assert results[token].status.value in ("completed", "failed"), results[token]
    return {r.call_id for r in results if r.call_id}
