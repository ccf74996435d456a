"""Chaos (C5, C7: nothing lost, nothing run twice): the broker crashes and restarts, stalls,
and goes away for 40 s.

Each test has a redis-server of its own (append-only file, fsync per write, as Redis is run
in production) and a sync and an async worker on it; the test SIGKILLs, SIGSTOPs/SIGCONTs and
restarts that server by PID mid-batch. It asserts, from the ledger the tools write themselves
and from the history stored in Redis: act() returned within its limit, lost 0, finished-and-
re-run 0, no non-idempotent call run twice, every call exactly one linked pair — and, since the
broker came back within TOOLFLEET_OUTAGE_LIMIT_S, no call failed at all.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.chaos_support import (
    Chaos,
    Ledger,
    act_and_load,
    broker_fixture,
    chaos_calls,
    chaos_settings,
    judge,
    start_chaos_worker,
)
from tests.support.fleet import WorkerProcess
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until_async
from toolfleet.dispatcher import Branch
from toolfleet.schemas.action import ActionResponseModel, CallParams

pytestmark = pytest.mark.chaos

OUTAGE_S = 40.0
OUTAGE_LIMIT_S = 75.0
WORKER_ENV = {
    "TOOLFLEET_VISIBILITY_TIMEOUT_S": "5",
    "TOOLFLEET_OUTAGE_LIMIT_S": str(OUTAGE_LIMIT_S),
}
FUNCTIONS = ("chaos_sync", "chaos_async", "chaos_sync_once", "chaos_async_once")


broker = broker_fixture(persist=True)


@pytest.fixture()
def fleet(broker: PrivateRedis) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    try:
        for kind, concurrency in (("sync", 3), ("async", 20)):
            started.append(start_chaos_worker(kind, broker, concurrency, WORKER_ENV))
        yield started
    finally:
        for worker in started:
            worker.stop(timeout_s=5)


def _run(
    broker: PrivateRedis,
    ledger: Ledger,
    n: int,
    fault: str,
    chaos: Chaos,
    limit_s: float,
    call_params: CallParams | None = None,
) -> None:
    rng = random.Random(n)
    requests = chaos_calls(ledger, FUNCTIONS, n, lambda _: rng.uniform(0.2, 0.8))
    settings = chaos_settings(broker, outage_limit_s=OUTAGE_LIMIT_S)
    results, stored, elapsed_s = act_and_load(
        settings, requests, chaos, limit_s=limit_s, call_params=call_params
    )
    verdict = judge(requests, results, stored, ledger, allowed_failures=())
    print(json.dumps({"chaos": fault, "elapsed_s": round(elapsed_s, 1), **verdict.summary()}))
    assert elapsed_s < limit_s
    verdict.assert_clean()


def test_broker_crashes_and_restarts_mid_batch_lose_and_repeat_nothing(
    broker: PrivateRedis, fleet: list[WorkerProcess], tmp_path: Path
) -> None:
    """Two crashes: calls are queued, reserved, running and still to be enqueued (a window of
    40) at each. Found by it: a worker exited on a restart (kombu), and calls enqueued while
    the broker was down failed at once."""
    ledger = Ledger(tmp_path)
    n = 160

    async def crash(branch: Branch, task: asyncio.Future[list[ActionResponseModel]]) -> None:
        for k in (1, 2):
            share = k * n // 3
            await until_async(
                lambda s=share: ledger.count("E") >= s,
                timeout_s=60,
                what=f"{k}/3 of the calls",
                while_running=task,
            )
            await asyncio.to_thread(broker.kill)
            await asyncio.sleep(1.0)  # down for a moment: connections fail, then come back
            await asyncio.to_thread(broker.start)

    params = CallParams(max_in_flight=40)
    _run(broker, ledger, n, "broker-restart-x2", crash, limit_s=150, call_params=params)
    # Every worker rode out both restarts (none exited, as kombu once made them).
    assert all(worker.process.poll() is None for worker in fleet), [w.log()[-2000:] for w in fleet]


def test_a_broker_stall_longer_than_the_socket_timeout_fails_no_call(
    broker: PrivateRedis, fleet: list[WorkerProcess], tmp_path: Path
) -> None:
    ledger = Ledger(tmp_path)
    n = 120

    async def stall(branch: Branch, task: asyncio.Future[list[ActionResponseModel]]) -> None:
        await until_async(
            lambda: ledger.count("E") >= n // 3,
            timeout_s=60,
            what="a third of the calls",
            while_running=task,
        )
        broker.pause()
        try:
            # Past redis-py's 5 s socket timeout, well short of the outage limit.
            await asyncio.sleep(7.0)
        finally:
            broker.resume()

    _run(broker, ledger, n, "broker-stall-7s", stall, limit_s=120)


def test_a_40_s_broker_outage_within_the_limit_loses_and_repeats_nothing(
    broker: PrivateRedis, fleet: list[WorkerProcess], tmp_path: Path
) -> None:
    ledger = Ledger(tmp_path)
    n = 40
    down: list[float] = []

    async def outage(branch: Branch, task: asyncio.Future[list[ActionResponseModel]]) -> None:
        await until_async(
            lambda: ledger.count("E") >= n // 4,
            timeout_s=60,
            what="a quarter of the calls",
            while_running=task,
        )
        await asyncio.to_thread(broker.kill)
        started = time.monotonic()
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(broker.start)
        down.append(time.monotonic() - started)

    _run(broker, ledger, n, "broker-outage-40s", outage, limit_s=OUTAGE_S + 90)
    assert down and down[0] >= OUTAGE_S
