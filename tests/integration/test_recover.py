"""A dispatcher SIGKILLed mid-batch, and its batch completed by recover (C5).

A child process acts on 40 calls through a window of 4 and is SIGKILLed once a few units are
in history: some calls are finished, some in flight, most never enqueued. ``toolfleet recover``
then writes every missing unit in input order: the branch ends with exactly one linked pair
per call, the ones never enqueued ABORTED with DispatcherLostError. A second recover writes
nothing; ``toolfleet status`` listed the batch as orphaned before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter

import pytest
import redis

from tests.support.chaos_support import sigkill_child_when
from tests.support.fleet import REPO_ROOT, WorkerProcess, run
from toolfleet.cli.admin import orphaned_batches
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.accept.context import call_id_for
from toolfleet.dispatcher.history.recover import recover_branch
from toolfleet.schemas.error_info import ErrorInfo
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.messages import ActionRequest, ActionResponse
from toolfleet.schemas.settings import Settings

CALLS = 40

_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from toolfleet.dispatcher import Branch, Fleet
    from toolfleet.schemas.action import CallParams
    from toolfleet.schemas.settings import Settings

    async def main() -> None:
        fleet = Fleet(Settings(broker_url=sys.argv[1], tools=("tests.support.sample_tools",)))
        branch = Branch(fleet=fleet, id=sys.argv[2])
        calls = [{"function": "sleep_async", "arguments": {"seconds": 0.4}}] * int(sys.argv[3])
        await branch.act(calls, call_params=CallParams(max_in_flight=4))

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_a_dead_dispatchers_batch_is_completed_once_by_recover(
    fleet_settings: Settings,
    redis_url: str,
    async_worker: WorkerProcess,
    redis_client: redis.Redis,
) -> None:
    keys = Keys(fleet_settings.key_prefix)
    branch_id = str(uuid.uuid4())
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    sigkill_child_when(
        ["-c", _CHILD, redis_url, branch_id, str(CALLS)],
        env,
        lambda: redis_client.llen(keys.history(branch_id)) >= 8,
        timeout_s=60,
        what="the child dispatcher to write 4 units",
    )
    written_before = redis_client.llen(keys.history(branch_id)) // 2
    assert written_before < CALLS
    # Its heartbeat expires within DISPATCHER_TTL_S; status lists the batch once it has.
    dispatchers = [k for k in redis_client.scan_iter(match=keys.dispatcher("*"))]
    for key in dispatchers:
        redis_client.delete(key)  # as if the TTL had run out (the child is dead)
    orphaned = orphaned_batches(redis_client, keys)
    assert any(b["branch_id"] == branch_id for b in orphaned), orphaned

    settings = fleet_settings.model_copy(update={"reconcile_grace_s": 1.0})

    async def recover_twice(fleet: Fleet) -> tuple[object, object, Branch]:
        first = await recover_branch(branch_id, fleet, wait_s=60)
        second = await recover_branch(branch_id, fleet, wait_s=60)
        return first, second, await Branch.load(branch_id, fleet=fleet)

    started = time.monotonic()
    first, second, branch = run(settings, recover_twice, timeout_s=120)
    assert time.monotonic() - started < 60
    assert first.written == CALLS - written_before  # type: ignore[attr-defined]
    assert second.written == 0 and second.batches == []  # type: ignore[attr-defined]

    messages = branch.messages
    assert len(messages) == 2 * CALLS
    requests = [m for m in messages if isinstance(m, ActionRequest)]
    responses = {m.id: m for m in messages if isinstance(m, ActionResponse)}
    assert len(requests) == CALLS and len(responses) == CALLS
    for request in requests:
        response = responses[request.content.action_response_id or ""]
        assert response.content.action_request_id == request.id
    call_ids = [e.call_id for e in branch.events]
    assert len(set(call_ids)) == CALLS, Counter(call_ids).most_common(3)
    statuses = Counter(e.execution["status"] for e in branch.events)
    assert set(statuses) <= {"completed", "aborted"}, statuses
    assert statuses["completed"] >= written_before
    aborted = [e for e in branch.events if e.execution["status"] == "aborted"]
    for event in aborted:
        assert "DispatcherLostError" in json.dumps(event.execution["error"])
    assert not orphaned_batches(redis_client, keys) or all(
        b["branch_id"] != branch_id for b in orphaned_batches(redis_client, keys)
    )


def test_toolfleet_recover_says_when_a_branch_has_no_open_batch(redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env.update({"TOOLFLEET_BROKER_URL": redis_url, "PYTHONPATH": str(REPO_ROOT)})
    branch_id = str(uuid.uuid4())
    done = subprocess.run(
        [sys.executable, "-m", "toolfleet.cli", "recover", branch_id, "--json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["written"] == 0
    assert f"no open batch for branch {branch_id!r}" in done.stderr


_STRAGGLER_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from toolfleet.dispatcher import Branch, Fleet
    from toolfleet.schemas.settings import Settings

    async def main() -> None:
        fleet = Fleet(Settings(broker_url=sys.argv[1], tools=("tests.support.sample_tools",)))
        branch = Branch(fleet=fleet, id=sys.argv[2])
        call = {"id": "straggler", "function": "sleep_async", "arguments": {"seconds": 30}}
        await branch.act([call])

    asyncio.run(main())
    """
)


def test_recover_records_a_straggler_as_the_live_path_does(
    fleet_settings: Settings,
    redis_url: str,
    async_worker: WorkerProcess,
    redis_client: redis.Redis,
) -> None:
    """A call still running when recover stops waiting ends FAILED ToolTimeoutError (with
    timeout_s: the wait), the error a live dispatcher records for a straggler."""
    keys = Keys(fleet_settings.key_prefix)
    branch_id = str(uuid.uuid4())
    call_id = call_id_for(branch_id, "straggler")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    sigkill_child_when(
        ["-c", _STRAGGLER_CHILD, redis_url, branch_id],
        env,
        lambda: redis_client.exists(keys.started(call_id)),
        timeout_s=60,
        what="the child dispatcher's call to start on a worker",
    )
    for key in redis_client.scan_iter(match=keys.dispatcher("*")):
        redis_client.delete(key)  # as if the dead child's heartbeat had run out

    async def recover(fleet: Fleet) -> Branch:
        await recover_branch(branch_id, fleet, wait_s=1.0)
        return await Branch.load(branch_id, fleet=fleet)

    branch = run(fleet_settings.model_copy(update={"reconcile_grace_s": 1.0}), recover)
    (event,) = [e for e in branch.events if e.call_id == call_id]
    assert event.status.value == "failed"
    info = ErrorInfo.from_record(event.execution["error"])
    assert info is not None and (info.type, info.module) == (
        "ToolTimeoutError",
        "toolfleet.schemas.errors",
    )
    assert info.fields == {"timeout_s": 1.0}
