"""Chaos (C5, C7): what a broker SIGKILLed mid-batch keeps, by persistence mode.

- ``appendfsync always`` and ``everysec``: a SIGKILLed redis-server (a crash of the process,
  not of its machine) comes back with every acknowledged write, since Redis write(2)s the
  append-only file before it replies and the kernel keeps what was written: lost 0,
  finished-and-re-run 0, no call failed, every call one linked pair in Redis.
- ``everysec`` when the *machine* crashes: the kernel's unsynced pages are gone too, so up to
  the last second of acknowledged writes is lost. The test cuts the append-only file back to
  its size a second before the kill. The dispatcher sees a broker that kept its data (its mark
  is older than a second) but not all of its history, and writes the branch's history again
  from memory; a call that finished within that second may have lost its record and its ack,
  so its message comes back and it runs again — the one re-run the window allows. Lost 0 and
  every pair in Redis still hold.
- no persistence: the broker comes back empty. act() returns, the dispatcher writes the
  history it holds back into Redis (every call one linked pair), and each call whose outcome
  the restart lost ends FAILED ``BrokerError`` saying it may have run — never a call whose
  result the dispatcher had received. (A finished call may run again here: its record, the
  idempotency key of C7, went with the data.)
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.chaos_support import (
    Chaos,
    Ledger,
    act_and_load,
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
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.chaos

OUTAGE_LIMIT_S = 30.0
WORKER_ENV = {
    "TOOLFLEET_VISIBILITY_TIMEOUT_S": "5",
    "TOOLFLEET_OUTAGE_LIMIT_S": str(OUTAGE_LIMIT_S),
}
FUNCTIONS = ("chaos_sync", "chaos_async", "chaos_sync_once", "chaos_async_once")
N_CALLS = 300
LIMIT_S = 55.0


@pytest.fixture()
def broker(request: pytest.FixtureRequest) -> Iterator[PrivateRedis]:
    """``request.param``: "none" (no persistence), or the appendfsync mode of an AOF."""
    mode = request.param
    server = PrivateRedis(
        persist=mode != "none",
        fsync="always" if mode == "none" else mode,
        client_timeout_s=5,
        ready_timeout_s=15,
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture()
def fleet(broker: PrivateRedis) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    try:
        for kind, concurrency in (("sync", 6), ("async", 40)):
            started.append(start_chaos_worker(kind, broker, concurrency, WORKER_ENV))
        yield started
    finally:
        for worker in started:
            worker.stop(timeout_s=5)


def _requests(ledger: Ledger, n: int = N_CALLS) -> list[dict[str, object]]:
    rng = random.Random(n)
    return chaos_calls(ledger, FUNCTIONS, n, lambda _: rng.uniform(0.05, 0.3))


def _kill_at_a_third(broker: PrivateRedis, ledger: Ledger, before_restart: object = None) -> Chaos:
    async def crash(branch: Branch, task: asyncio.Future[list[ActionResponseModel]]) -> None:
        await until_async(
            lambda: ledger.count("E") >= N_CALLS // 3,
            timeout_s=30,
            what="a third of the calls",
            while_running=task,
        )
        await asyncio.to_thread(broker.kill)
        if callable(before_restart):
            before_restart()
        await asyncio.sleep(0.5)
        await asyncio.to_thread(broker.start)

    return crash


def _act_through_a_crash(
    broker: PrivateRedis, ledger: Ledger, before_restart: object = None
) -> tuple[list[dict[str, object]], list[ActionResponseModel], Branch, float]:
    """``N_CALLS`` calls acted on the fleet while the broker is SIGKILLed at a third of them
    (``before_restart`` runs while it is down) and restarted: (requests, results, the branch
    loaded back, seconds act() took)."""
    requests = _requests(ledger)
    settings = chaos_settings(broker, outage_limit_s=OUTAGE_LIMIT_S)
    results, stored, elapsed_s = act_and_load(
        settings,
        requests,
        _kill_at_a_third(broker, ledger, before_restart),
        limit_s=LIMIT_S,
        call_params=CallParams(max_in_flight=60),
    )
    return requests, results, stored, elapsed_s


@pytest.mark.parametrize("broker", ["always", "everysec"], indirect=True)
def test_a_persistent_broker_sigkilled_mid_batch_loses_and_repeats_nothing(
    broker: PrivateRedis, fleet: list[WorkerProcess], tmp_path: Path
) -> None:
    fsync = broker.fsync
    ledger = Ledger(tmp_path)
    requests, results, stored, elapsed_s = _act_through_a_crash(broker, ledger)
    verdict = judge(requests, results, stored, ledger, allowed_failures=())
    print(json.dumps({"chaos": f"sigkill-{fsync}", "elapsed_s": round(elapsed_s, 1),
                      **verdict.summary()}))  # fmt: skip
    assert elapsed_s < LIMIT_S
    verdict.assert_clean()
    assert all(w.process.poll() is None for w in fleet)


class _AofSampler:
    """Samples (time, append-only file size, ledger lines) every 50 ms, so a test can cut the
    file back to what it held a second earlier: what a machine crash under ``everysec`` can
    lose at most (Redis fsyncs once a second; a slow disk can stretch that to two)."""

    def __init__(self, broker: PrivateRedis, ledger: Ledger) -> None:
        self.broker, self.ledger = broker, ledger
        self.samples: list[tuple[float, Path, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            files = self.broker.aof_files()
            if files:
                ledger_lines = len(self.ledger.lines()) if self.ledger.path.exists() else 0
                size = files[-1].stat().st_size
                self.samples.append((time.monotonic(), files[-1], size, ledger_lines))

    def cut_back(self, seconds: float) -> bytes:
        """Stop sampling; truncate the newest AOF to its size ``seconds`` ago. Returns the
        writes cut off (the commands a machine crash would have lost)."""
        self._stop.set()
        self._thread.join()
        now = time.monotonic()
        # The newest sample at least ``seconds`` old; on a fast machine the kill can come
        # sooner than that after sampling began, and then the oldest sample (less is lost).
        older = [s for s in self.samples if now - s[0] >= seconds] or self.samples[:1]
        assert older, "no AOF sample was taken before the crash"
        _t, path, size, _ledger_lines = older[-1]
        assert path.stat().st_size > size, "no write in the last second to lose"
        with open(path, "r+b") as f:
            f.seek(size)
            tail = f.read()
            f.truncate(size)
        return tail


@pytest.mark.parametrize("broker", ["everysec"], indirect=True)
def test_everysec_machine_crash_loses_at_most_the_last_second_and_history_is_rewritten(
    broker: PrivateRedis, fleet: list[WorkerProcess], tmp_path: Path
) -> None:
    ledger = Ledger(tmp_path)
    sampler = _AofSampler(broker, ledger)
    cut: list[bytes] = []
    requests, results, stored, elapsed_s = _act_through_a_crash(
        broker, ledger, lambda: cut.append(sampler.cut_back(1.0))
    )
    verdict = judge(requests, results, stored, ledger, allowed_failures=())
    print(json.dumps({"chaos": "everysec-last-second-lost",
                      "elapsed_s": round(elapsed_s, 1), **verdict.summary()}))  # fmt: skip
    assert elapsed_s < LIMIT_S
    # Every call ends as it ran, with its pair in Redis: the history the lost second
    # took is written again from the dispatcher's memory.
    assert not verdict.lost, verdict.lost[:5]
    assert not verdict.unpaired, verdict.unpaired[:5]
    # A call runs again only when its record (its idempotency key, C7) was among the
    # writes the crash lost: its message, restored from the unacked set, finds none.
    lost_writes = cut[0]
    repeated = set(verdict.finished_rerun) | set(verdict.rerun_not_idempotent)
    for token in repeated:
        call_id = results[token].call_id or ""
        assert call_id.encode() in lost_writes, (token, call_id)


@pytest.mark.parametrize("broker", ["none"], indirect=True)
def test_a_broker_back_empty_gets_every_pair_back_and_act_returns(
    broker: PrivateRedis, fleet: list[WorkerProcess], tmp_path: Path
) -> None:
    ledger = Ledger(tmp_path)
    requests, results, stored, elapsed_s = _act_through_a_crash(broker, ledger)
    # The lost calls' queued messages went with the data: BrokerError, may have run.
    verdict = judge(requests, results, stored, ledger, allowed_failures=("BrokerError",))
    print(json.dumps({"chaos": "empty-restart", "elapsed_s": round(elapsed_s, 1),
                      **verdict.summary()}))  # fmt: skip
    assert elapsed_s < LIMIT_S
    # Every pair in Redis, the ones written before the restart included.
    assert not verdict.unpaired, verdict.unpaired[:5]
    assert len(stored.messages) == 2 * N_CALLS
    assert not verdict.lost, verdict.lost[:5]
    # No finished-and-re-run count is asserted: without persistence the restart takes
    # the calls' records (their idempotency keys, C7) with it, so a message a worker
    # still holds may run a finished call again. That is what persistence is for.
    for result in results:
        if result.status is EventStatus.FAILED:
            assert "may have run" in (result.error or ""), result.error
    # Those written before it were there: at least a third completed first.
    assert verdict.outcomes.get("completed", 0) >= N_CALLS // 3
