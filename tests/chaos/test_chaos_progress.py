"""Chaos, progress (docs/controls.md): a worker SIGKILLed while its tools report progress, and a
dispatcher SIGKILLed while its calls report, then a dispatcher that starts again.

- The worker: each call ends as it would without progress (an idempotent one re-runs and
  COMPLETES, a non-idempotent one FAILS WorkerLostError), act() returns, and nothing is left
  behind: no listener in the collector, nothing on the reply list, no started marker.
- The dispatcher: the dead dispatcher's reply list, where the worker kept pushing reports,
  expires like any reply list; a new dispatcher handed those reports (calls it never knew)
  drops them and runs its own calls, with their progress, as usual; the dead batch is
  completed by ``Branch.recover``.

Each test has its own redis-server and real workers. Run with ``pytest -m chaos``.
"""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.support.chaos_support import broker_fixture, sigkill_child_when
from tests.support.fleet import REPO_ROOT, WorkerProcess, call, start_worker
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until, until_async
from toolfleet.cli.admin import orphaned_batches
from toolfleet.dispatcher import Branch, CallProgress, Fleet
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.progress import decode, is_progress
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.chaos

TOOLS = ("tests.support.sample_tools",)
WORKER_ENV = {"TOOLFLEET_VISIBILITY_TIMEOUT_S": "5"}
LIMIT_S = 90.0

broker = broker_fixture(persist=False)  # `workers` is conftest's


def _worker(broker: PrivateRedis, kind: str = "sync") -> WorkerProcess:
    return start_worker(kind, redis_url=broker.url, tools=TOOLS, concurrency=2, env=WORKER_ENV)


def test_a_worker_sigkilled_mid_progress_leaves_no_stuck_state(
    broker: PrivateRedis, workers: list[WorkerProcess]
) -> None:
    workers.append(_worker(broker))
    settings = Settings(broker_url=broker.url, tools=TOOLS, reconcile_grace_s=1.0)
    requests = [
        call("count_sync", n=40, delay_s=0.1),  # not idempotent: WorkerLostError
        call("count_sync_idempotent", n=40, delay_s=0.1),  # re-runs
    ]

    async def scenario() -> tuple[list[CallProgress], list[ActionResponseModel], float]:
        received: list[CallProgress] = []
        async with Fleet(settings) as fleet:
            branch = Branch(fleet=fleet)
            branch.on_progress(received.append)
            started = time.monotonic()
            act = asyncio.ensure_future(branch.act(requests))
            await until_async(
                lambda: len({p.call_id for p in received}) == 2,
                timeout_s=30,
                what="both calls running and reporting progress",
                while_running=act,
            )
            workers[0].kill()  # the worker and its prefork children, mid-report
            workers.append(await asyncio.to_thread(_worker, broker))
            results = await asyncio.wait_for(act, LIMIT_S)
            elapsed_s = time.monotonic() - started
            # Nothing stuck on the dispatcher: no listener, nothing left on the reply list.
            assert fleet.collector._listeners == {}
            assert await fleet.redis.llen(fleet.reply_key) == 0
            return received, results, elapsed_s

    received, results, elapsed_s = asyncio.run(scenario())
    lost, rerun = results
    assert lost.status is EventStatus.FAILED and (lost.error or "").startswith("WorkerLostError")
    assert rerun.status is EventStatus.COMPLETED and rerun.output == 40
    # The re-run reported again from the start, and its last report arrived.
    rerun_reports = [p.done for p in received if p.call_id == rerun.call_id]
    assert rerun_reports[-1] == 40.0 and 1.0 in rerun_reports[1:]
    with broker.client() as client:
        assert list(client.scan_iter(match=Keys().started("*"))) == []
    print(json.dumps({"chaos": "progress-worker-sigkill", "elapsed_s": round(elapsed_s, 1),
                      "reports": len(received)}))  # fmt: skip
    assert elapsed_s < LIMIT_S


_DISPATCHER = textwrap.dedent(
    """
    import asyncio, sys
    from toolfleet.dispatcher import Branch, Fleet
    from toolfleet.schemas.settings import Settings

    async def main() -> None:
        url, branch_id, marker = sys.argv[1], sys.argv[2], sys.argv[3]
        fleet = Fleet(Settings(broker_url=url, tools=("tests.support.sample_tools",)))
        branch = Branch(fleet=fleet, id=branch_id)
        open(marker + ".key", "w").write(fleet.reply_key)
        branch.on_progress(lambda p: open(marker, "a").write(f"{p.done}\\n"))
        await branch.act([{"function": "count_sync_idempotent",
                           "arguments": {"n": 30, "delay_s": 0.1}}])

    asyncio.run(main())
    """
)


def test_a_restarted_dispatcher_drops_progress_of_calls_it_does_not_know(
    broker: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    workers.append(_worker(broker))
    branch_id = str(uuid.uuid4())
    marker = tmp_path / "progress.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["PYTHONPATH"] = str(REPO_ROOT)

    def reporting() -> bool:
        return marker.exists() and len(marker.read_text().split()) >= 3

    sigkill_child_when(
        ["-c", _DISPATCHER, broker.url, branch_id, str(marker)],
        env,
        reporting,
        timeout_s=60,
        what="the dispatcher's call to report progress",
    )
    dead_list = Path(f"{marker}.key").read_text()
    with broker.client() as client:
        # The worker goes on pushing reports onto the dead dispatcher's list, which expires.
        until(
            lambda: client.llen(dead_list) >= 3,
            timeout_s=30,
            what="the worker to push reports onto the dead dispatcher's reply list",
        )
        stale: list[bytes] = client.lrange(dead_list, 0, -1)
        assert stale and all(is_progress(raw) for raw in stale)
        assert 0 < client.ttl(dead_list) <= Settings().record_ttl_s
        # Its batch is recoverable once the dead dispatcher's liveness key has expired.
        until(
            lambda: any(b["branch_id"] == branch_id for b in orphaned_batches(client, Keys())),
            timeout_s=60,
            interval_s=0.5,
            what="the batch to be listed as orphaned",
        )

    settings = Settings(broker_url=broker.url, tools=TOOLS, reconcile_grace_s=1.0)

    async def restarted() -> tuple[list[CallProgress], ActionResponseModel, Branch]:
        received: list[CallProgress] = []
        async with Fleet(settings) as fleet:
            # As if it were handed the dead dispatcher's list: reports of a call it never sent.
            await fleet.redis.rpush(fleet.reply_key, *stale)
            branch = Branch(fleet=fleet)
            branch.on_progress(received.append)
            (result,) = await asyncio.wait_for(
                branch.act([call("count_sync", n=3, delay_s=0.12)]), LIMIT_S
            )
            recovered = await Branch.recover(branch_id, fleet=fleet, wait_s=60)
            return received, result, recovered

    received, result, recovered = asyncio.run(restarted())
    assert result.status is EventStatus.COMPLETED
    assert [p.done for p in received] == [1.0, 2.0, 3.0]
    assert {p.call_id for p in received} == {result.call_id}
    dead_call = {r.call_id for raw in stale if (r := decode(raw)) is not None}
    assert not dead_call & {p.call_id for p in received}
    # The dead dispatcher's call: re-run or finished on its worker, recorded once in history.
    assert len(recovered.messages) == 2
    print(json.dumps({"chaos": "progress-dispatcher-restart", "stale_reports": len(stale)}))
