"""Chaos (C7: nothing lost, nothing finished run again): worker SIGKILL storms, async and sync,
with real processes.

A batch runs on two workers of one kind while the test SIGKILLs workers (and prefork
children) again and again, starting a fresh worker after each whole-worker kill. Each test
asserts, from the ledger the tools write themselves and from the history stored in Redis:
act() returned within its limit, lost 0, finished-and-re-run 0, no non-idempotent call run
twice, every call exactly one linked pair.

Each test has its own redis-server, so the short visibility timeout its workers need never
redelivers another test's calls. Run with ``pytest -m chaos``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
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
    replace_a_worker,
    start_chaos_worker,
)
from tests.support.fleet import WorkerProcess
from tests.support.redis_server import PrivateRedis
from tests.support.reliability_support import kill_pid
from tests.support.waiting import until_async
from toolfleet.dispatcher import Branch
from toolfleet.schemas.action import ActionResponseModel

pytestmark = pytest.mark.chaos

# A dead worker's unacked calls are handed to another worker after this long. A live worker's
# reserved calls count against it too, so each async worker reserves one call per slot: on a
# loaded machine a deeper prefetch outlives the timeout and every such call is delivered twice
# (harmless, C7, but each duplicate holds a slot while it waits for the first).
WORKER_ENV = {"TOOLFLEET_VISIBILITY_TIMEOUT_S": "5", "TOOLFLEET_ASYNC_PREFETCH": "1"}
LIMIT_S = 240.0

broker = broker_fixture(persist=False)


class _Storm:
    """One storm's parts: ``n`` calls of ``kind`` (half idempotent) sleeping ``seconds`` apart
    from a seeded rng, two ``kind`` workers of ``concurrency`` slots, and the PIDs killed."""

    kills = 4

    def __init__(
        self,
        kind: str,
        broker: PrivateRedis,
        concurrency: int,
        directory: Path,
        *,
        seed: int,
        n: int,
        seconds: tuple[float, float],
    ) -> None:
        self.broker = broker
        self.ledger = Ledger(directory)
        self.rng = random.Random(seed)
        functions = (f"chaos_{kind}", f"chaos_{kind}_once")
        self.requests = chaos_calls(self.ledger, functions, n, lambda _: self.rng.uniform(*seconds))
        self.start: Callable[[], WorkerProcess] = lambda: start_chaos_worker(
            kind, broker, concurrency, WORKER_ENV
        )
        self.pool = [self.start() for _ in range(2)]
        self.killed: set[int] = set()  # every process the storm SIGKILLed

    def reached(self, k: int) -> bool:
        """Whether the k-th of ``kills + 2`` shares of the calls has finished."""
        return self.ledger.count("E") >= k * len(self.requests) // (self.kills + 2)

    async def replace_a_worker(self) -> None:
        self.killed.update(await replace_a_worker(self.pool, self.rng, self.start))

    def run(self, name: str, storm: Chaos) -> None:
        """Act on the calls while ``storm`` kills, stop the pool, and assert the verdict."""
        settings = chaos_settings(self.broker)
        try:
            results, stored, elapsed_s = act_and_load(
                settings, self.requests, storm, limit_s=LIMIT_S
            )
        finally:
            for worker in self.pool:
                worker.stop(timeout_s=5)
        verdict = judge(self.requests, results, stored, self.ledger, killed_pids=self.killed)
        summary = {"chaos": name, "kills": self.kills, "elapsed_s": round(elapsed_s, 1)}
        print(json.dumps({**summary, **verdict.summary()}))
        assert elapsed_s < LIMIT_S
        verdict.assert_clean()


def test_an_async_worker_sigkill_storm_loses_and_repeats_nothing(
    broker: PrivateRedis, tmp_path: Path
) -> None:
    chaos = _Storm("async", broker, 20, tmp_path, seed=12, n=300, seconds=(0.4, 1.4))

    async def storm(branch: Branch, task: asyncio.Future[list[ActionResponseModel]]) -> None:
        for k in range(1, chaos.kills + 1):
            await until_async(
                lambda k=k: chaos.reached(k),
                timeout_s=120,
                what=f"{k}/{chaos.kills + 2} of the calls to finish",
                while_running=task,
            )
            await chaos.replace_a_worker()

    chaos.run("async-sigkill-storm", storm)


def test_a_sync_worker_sigkill_storm_loses_and_repeats_nothing(
    broker: PrivateRedis, tmp_path: Path
) -> None:
    chaos = _Storm("sync", broker, 2, tmp_path, seed=8, n=60, seconds=(0.3, 0.9))
    ledger, pool = chaos.ledger, chaos.pool

    def running_child() -> int | None:
        """The PID of a prefork child now running a call (started, not ended)."""
        marks = ledger.marks()
        for phase, token, pid, _host in reversed(ledger.lines()):
            if phase == "S" and "E" not in marks[token]:
                return pid
        return None

    async def storm(branch: Branch, task: asyncio.Future[list[ActionResponseModel]]) -> None:
        for k in range(1, chaos.kills + 1):
            seen: list[int] = []  # the running child the condition saw (it may end meanwhile)

            def ready(k: int = k, seen: list[int] = seen) -> bool:
                child = running_child()
                if child is None or not chaos.reached(k):
                    return False
                seen.append(child)
                return True

            await until_async(
                ready,
                timeout_s=120,
                what=f"{k}/{chaos.kills + 2} of the calls, one running",
                while_running=task,
            )
            if k % 2:  # a prefork child dies mid-call; its worker forks another
                child = seen[-1]
                assert child not in {w.pid for w in pool}
                chaos.killed.add(child)
                kill_pid(child)
            else:  # a whole worker dies with its children
                await chaos.replace_a_worker()

    chaos.run("sync-sigkill-storm", storm)
