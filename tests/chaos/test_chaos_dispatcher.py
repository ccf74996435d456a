"""Chaos (C5, C7: the history completed exactly once): the dispatcher SIGKILLed mid-batch and
``toolfleet recover``; a batch that needs a worker kind no one runs.

Each test has its own redis-server and real workers. It asserts, from the ledger the tools
write themselves and from the history stored in Redis: the batch ended (recover finished, or
act() returned) within its limit, lost 0, finished-and-re-run 0, no non-idempotent call run
twice, every call exactly one linked pair; a call never enqueued, or never taken by a worker,
never ran at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.act_process import act_argv
from tests.support.chaos_support import (
    CHAOS_TOOLS,
    Ledger,
    act_and_load,
    broker_fixture,
    chaos_calls,
    chaos_settings,
    judge,
    sigkill_child_when,
    start_chaos_worker,
    stored_branch,
    stored_results,
)
from tests.support.fleet import REPO_ROOT, WorkerProcess
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until
from toolfleet.cli.admin import orphaned_batches
from toolfleet.dispatcher import Branch
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings

pytestmark = pytest.mark.chaos

WORKER_ENV = {"TOOLFLEET_VISIBILITY_TIMEOUT_S": "5"}


broker = broker_fixture(persist=False)  # `workers` is conftest's


def _start(kind: str, broker: PrivateRedis, concurrency: int) -> WorkerProcess:
    return start_chaos_worker(kind, broker, concurrency, WORKER_ENV)


def test_a_sigkilled_dispatchers_batch_is_completed_by_toolfleet_recover(
    broker: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    workers += [_start("sync", broker, 2), _start("async", broker, 10)]
    ledger = Ledger(tmp_path)
    n = 60
    functions = ("chaos_sync", "chaos_async", "chaos_sync_once", "chaos_async_once")
    requests = chaos_calls(ledger, functions, n, lambda i: 0.3 + (i % 5) / 10)
    branch_id = str(uuid.uuid4())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    sigkill_child_when(
        act_argv(broker.url, branch_id, ("tests.support.chaos_tools",), requests, max_in_flight=6),
        env,
        lambda: ledger.count("E") >= n // 4,
        timeout_s=90,
        what="a quarter of the calls to finish",
    )
    killed_at = time.monotonic()
    keys = Keys()
    with broker.client() as client:
        # `toolfleet status` names the batch once the dead dispatcher's heartbeat expires.
        until(
            lambda: any(b["branch_id"] == branch_id for b in orphaned_batches(client, keys)),
            timeout_s=60,
            interval_s=0.5,
            what="the batch to be listed as orphaned",
        )
    env["TOOLFLEET_BROKER_URL"] = broker.url
    env["TOOLFLEET_RECONCILE_GRACE_S"] = "1"
    recover = [sys.executable, "-m", "toolfleet.cli", "recover", branch_id, "--json"]
    first = subprocess.run(
        [*recover, "--wait-s", "60"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    recovered_s = time.monotonic() - killed_at
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    second = subprocess.run(
        recover, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert json.loads(second.stdout)["written"] == 0, second.stdout  # nothing written twice

    settings = Settings(broker_url=broker.url, tools=CHAOS_TOOLS)
    stored = asyncio.run(stored_branch(settings, branch_id))
    results = stored_results(stored)
    assert len(results) == n, f"{len(results)} of {n} calls in history"
    verdict = judge(
        requests,
        results,
        stored,
        ledger,
        allowed_failures=("WorkerLostError", "DispatcherLostError"),
        never_started=("DispatcherLostError",),
    )
    print(json.dumps({
        "chaos": "dispatcher-sigkill-recover", "recovered_s": round(recovered_s, 1),
        "written_by_recover": report["written"], **verdict.summary(),
    }))  # fmt: skip
    assert recovered_s < 120
    verdict.assert_clean()
    marks = ledger.marks()
    for request, result in zip(requests, results, strict=True):
        if result.status.value == "aborted":  # never enqueued: never ran
            assert result.error and result.error.startswith("DispatcherLostError"), result
            assert not marks.get(request["arguments"]["token"]), result


def test_a_missing_worker_kind_fails_its_calls_no_worker_error_and_they_never_run(
    broker: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    workers.append(_start("sync", broker, 2))  # no async worker at all
    ledger = Ledger(tmp_path)
    n = 30
    requests = chaos_calls(ledger, ("chaos_sync", "chaos_async"), n, lambda _: 0.2)
    timeout_s = 3.0
    settings = chaos_settings(broker, no_worker_timeout_s=timeout_s)

    async def nothing(branch: Branch, task: asyncio.Future[list[ActionResponseModel]]) -> None:
        return None

    limit_s = 60.0
    results, stored, elapsed_s = act_and_load(settings, requests, nothing, limit_s=limit_s)
    verdict = judge(
        requests,
        results,
        stored,
        ledger,
        allowed_failures=("NoWorkerError",),
        never_started=("NoWorkerError",),
    )
    print(json.dumps({"chaos": "missing-worker-kind", "elapsed_s": round(elapsed_s, 1),
                      **verdict.summary()}))  # fmt: skip
    assert elapsed_s < limit_s
    verdict.assert_clean()
    failed = [r for r in results if r.status.value == "failed"]
    assert len(failed) == n // 2
    assert all(r.function == "chaos_async" for r in failed)
    assert all(settings.async_queue in (r.error or "") for r in failed)

    # A worker of the missing kind turning up afterwards finds each call's FAILED record and
    # runs none of them (C7).
    workers.append(_start("async", broker, 10))
    with broker.client() as client:
        until(
            lambda: client.llen(settings.async_queue) == 0 and not client.hlen("unacked"),
            timeout_s=60,
            what="the late async worker to take every message",
        )
    marks = ledger.marks()
    assert not any(marks.get(r.output) for r in failed)
    never_ran = [i for i in range(1, n, 2) if marks.get(i)]
    assert never_ran == [], f"async calls run after NoWorkerError: {never_ran}"
