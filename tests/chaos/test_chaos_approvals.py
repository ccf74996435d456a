"""Chaos for durable approvals: the dispatcher SIGKILLed while calls wait for approval, and
``toolfleet recover`` keeping them decidable.

A dispatcher in a process of its own acts on a batch of 6 calls that need approval (``refund``)
among 20 that do not (``free_lookup``). Once every parked call is listed by ``toolfleet approvals``
and every plain call has run, the dispatcher is SIGKILLed; ``toolfleet recover`` then runs in
the background while a second terminal approves 3 of the parked calls and denies 2 with a
reason; the last one is left undecided, so recover ends it (expired) when its wait passes.

Everything is a real process on a redis-server of the test's own. It asserts, from the side
channel the tools write themselves and from the history stored in Redis: each approved call ran
exactly once, the denied and the expired ones never ran, each plain call ran exactly once; every
call of the batch has one linked request/response pair; the refused calls' records say who
decided, and why; no call is left waiting for approval.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.act_process import act_argv
from tests.support.approvals import ran
from tests.support.chaos_support import (
    broker_fixture,
    sigkill_child_when,
    stored_branch,
    stored_results,
)
from tests.support.cli_support import REPO_ROOT, cli_env, killed_on_exit, toolfleet, toolfleet_argv
from tests.support.fleet import WorkerProcess, assert_linked_pairs, call, start_worker
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until
from toolfleet.cli.admin import orphaned_batches
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.chaos

TOOLS = ("tests.support.approval_tools",)
PARKED = (3, 7, 11, 15, 19, 23)  # the tokens (and batch positions) of the refund calls
CALLS = 26  # 6 refunds among 20 free lookups
APPROVED, DENIED, UNDECIDED = (3, 11, 19), (7, 23), 15
REASON = "refunds need a ticket number"
WAIT_S = 20  # recover's --wait-s: how long it waits for the undecided call


broker = broker_fixture(persist=False)  # `workers` is conftest's


def listed(home: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """``toolfleet approvals --json``, from another terminal."""
    done = toolfleet("approvals", "--json", home=home, env=env, timeout_s=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_calls_parked_by_a_sigkilled_dispatcher_are_decided_while_toolfleet_recover_waits(
    broker: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    for kind in ("sync", "async"):
        workers.append(start_worker(kind, redis_url=broker.url, tools=TOOLS))
    side = tmp_path / "side"
    requests = [
        call("refund", side=str(side), token=i, amount=5)
        if i in PARKED
        else call("free_lookup", side=str(side), token=i)
        for i in range(CALLS)
    ]
    plain = [i for i in range(CALLS) if i not in PARKED]
    branch_id = str(uuid.uuid4())
    env = {"TOOLFLEET_BROKER_URL": broker.url}
    waiting: list[dict[str, Any]] = []

    def all_parked_and_the_rest_ran() -> bool:
        done = ran(side)
        if any(("free_lookup", i) not in done for i in plain):
            return False
        waiting[:] = listed(tmp_path, env)
        return len(waiting) == len(PARKED)

    sigkill_child_when(
        act_argv(broker.url, branch_id, TOOLS, requests),
        cli_env(tmp_path),
        all_parked_and_the_rest_ran,
        timeout_s=60,
        what="every refund to be listed as waiting and every lookup to have run",
    )
    assert {w["branch_id"] for w in waiting} == {branch_id}
    call_of = {w["arguments"]["token"]: w["call_id"] for w in waiting if w["tool"] == "refund"}
    assert sorted(call_of) == list(PARKED)
    assert not any(tool == "refund" for tool, _ in ran(side))  # parked calls run nowhere

    # The dead dispatcher's heartbeat lapses: its batch is listed as orphaned (recover skips a
    # batch whose dispatcher still beats).
    with broker.client() as client:
        until(
            lambda: any(b["branch_id"] == branch_id for b in orphaned_batches(client, Keys())),
            timeout_s=30,
            interval_s=0.5,
            what="the batch to be listed as orphaned",
        )
    recover_env = cli_env(tmp_path, {**env, "TOOLFLEET_RECONCILE_GRACE_S": "1"})
    recover_argv = toolfleet_argv("recover", branch_id, "--wait-s", str(WAIT_S), "--json")
    recovering = subprocess.Popen(
        recover_argv,
        cwd=REPO_ROOT,
        env=recover_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started_s = time.monotonic()
    with killed_on_exit(recovering):
        # A second terminal decides five of the six while recover waits for them.
        for token in APPROVED:
            done = toolfleet("approve", call_of[token], "--by", "alice", home=tmp_path, env=env)
            assert done.returncode == 0, done.stderr
        for token in DENIED:
            done = toolfleet(
                "deny", call_of[token], "--reason", REASON, "--by", "bob", home=tmp_path, env=env
            )
            assert done.returncode == 0, done.stderr
        decided_s = time.monotonic() - started_s
        assert recovering.poll() is None, "recover ended before the decisions were made"
        out, err = recovering.communicate(timeout=WAIT_S + 60)
    recovered_s = time.monotonic() - started_s
    assert recovering.returncode == 0, err
    report = json.loads(out)
    assert len(report["batches"]) == 1 and report["skipped_live"] == [], report
    assert report["outcomes"].get("skipped") == len(DENIED) + 1, report

    # The side channel: what really ran.
    runs = Counter(ran(side))
    expected = Counter({("free_lookup", i): 1 for i in plain})
    expected.update({("refund", i): 1 for i in APPROVED})
    assert runs == expected, f"ran {dict(runs)}"

    # The history stored in Redis: one linked pair per call, each call's record as decided.
    settings = Settings(broker_url=broker.url, tools=TOOLS)
    stored = asyncio.run(stored_branch(settings, branch_id))
    results = stored_results(stored)
    assert [r.arguments["token"] for r in results] == list(range(CALLS))
    assert_linked_pairs(stored, results)
    events = {e.call_id: e for e in stored.events}
    assert len(events) == len(stored.events) == CALLS, "a call has more than one event"
    for token, result in enumerate(results):
        event = events[result.call_id]
        assert event.status is result.status, (token, event.status, result.status)
        if token in plain:
            assert result.status is EventStatus.COMPLETED and result.output == f"looked up {token}"
        elif token in APPROVED:
            assert result.status is EventStatus.COMPLETED and result.output == "refunded 5"
            assert event.approval is not None and event.approval["decision"] == "approved"
            assert event.approval["by"] == "alice"
        elif token in DENIED:
            assert result.status is EventStatus.SKIPPED, result
            assert event.approval is not None and event.approval["decision"] == "denied"
            assert event.approval["by"] == "bob" and event.approval["reason"] == REASON
            assert result.output["error"] == (
                f"call of tool 'refund' was not run: denied by bob: {REASON}"
            )
        else:
            assert token == UNDECIDED
            assert result.status is EventStatus.SKIPPED, result
            assert event.approval is not None and event.approval["decision"] == "expired"
            assert event.approval["by"] == "recover"
            assert "no one approved it within its approval time" in result.output["error"]

    assert listed(tmp_path, env) == []
    with broker.client() as client:
        assert client.zcard(Keys().approvals()) == 0
    print(json.dumps({
        "chaos": "dispatcher-sigkill-approvals-recover", "decided_s": round(decided_s, 1),
        "recovered_s": round(recovered_s, 1), "written_by_recover": report["written"],
        "outcomes": report["outcomes"],
    }))  # fmt: skip
    assert recovered_s < WAIT_S + 30
