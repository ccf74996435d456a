"""A synchronous API for scripts, and one Fleet used across event loops.

``branch.act_sync()`` runs a batch on a private loop and closes what it opened; a Fleet used
from several loops (one after another, or at once from threads) keeps a share per loop, each
closed when its loop ends through ``asyncio.run``. Real Redis, real workers.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import subprocess
import sys
import threading
from typing import Any

import pytest
import redis

from tests.support.fleet import REPO_ROOT, assert_linked_pairs, call
from toolfleet.dispatcher import Branch, Fleet, HookPoint
from toolfleet.schemas.errors import MalformedRequestError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.usefixtures("sync_worker", "async_worker")


def _alive(client: redis.Redis, fleet: Fleet, dispatcher_id: str) -> bool:
    """Whether the liveness key of one loop's share is set (its reconciler deletes it on
    close, so a share that was really closed leaves none)."""
    return bool(client.exists(Keys(fleet.settings.key_prefix).dispatcher(dispatcher_id)))


def test_act_sync_twice_in_a_row_runs_each_batch_and_closes_its_loop_share(
    fleet_settings: Settings, redis_client: redis.Redis
) -> None:
    fleet = Fleet(fleet_settings)
    branch = Branch(fleet=fleet)
    seen_ids: list[str] = []

    first = branch.act_sync(
        [call("add", a=1, b=2), call("sleep_async", seconds=0.05), call("fail", message="no")]
    )
    assert [r.status for r in first] == [
        EventStatus.COMPLETED,
        EventStatus.COMPLETED,
        EventStatus.FAILED,
    ]
    assert [r.output for r in first[:2]] == [3, 0.05]
    assert "no" in (first[2].error or "")
    assert fleet.loops_bound == 0  # the private loop's clients are closed, not left behind

    second = branch.act_sync([call("echo", value="again"), call("add", a=2, b=2)])
    assert [r.output for r in second] == ["again", 4]
    assert fleet.loops_bound == 0
    assert_linked_pairs(branch, first + second)

    # The same fleet, now from an async caller's loop, with no aclose() anywhere: the
    # history both act_sync calls wrote is in Redis, and the loop's share closes by itself.
    async def load() -> list[str]:
        loaded = await Branch.load(branch.id, fleet=fleet)
        seen_ids.append(fleet.collector_id)
        return [m.id for m in loaded.messages]

    assert asyncio.run(load()) == [m.id for m in branch.messages]
    assert fleet.loops_bound == 0
    assert not _alive(redis_client, fleet, seen_ids[0])


def test_act_sync_from_threads_at_once_keeps_each_threads_results(
    fleet_settings: Settings,
) -> None:
    """Two threads share one fleet, each act_sync on its own private loop at the same time:
    each loop has its own reply list, so neither takes the other's results."""
    fleet = Fleet(fleet_settings)
    both_started = threading.Barrier(2, timeout=60)
    outputs: dict[int, list[Any]] = {}
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            branch = Branch(fleet=fleet)
            both_started.wait()
            calls = [call("sleep_async", seconds=0.3)]
            calls += [call("echo", value=f"t{n}-{i}") for i in range(10)]
            results = branch.act_sync(calls)
            assert_linked_pairs(branch, results)
            outputs[n] = [r.output for r in results]
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    for n in range(2):
        assert outputs[n] == [0.3] + [f"t{n}-{i}" for i in range(10)]
    assert fleet.loops_bound == 0


def test_act_sync_inside_a_running_loop_raises_and_sends_nothing(
    fleet_settings: Settings, redis_client: redis.Redis
) -> None:
    """Sync code called from a running loop (a notebook cell, an async framework) would block
    that loop until the batch ends: act_sync refuses, naming what to do instead, and
    nothing is sent or recorded."""
    fleet = Fleet(fleet_settings)
    branch = Branch(fleet=fleet)

    async def caller() -> str:
        try:
            branch.act_sync([call("add", a=20, b=22)])
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    message = asyncio.run(caller())
    assert "running event loop" in message and "await branch.act(" in message
    assert branch.messages == [] and fleet.loops_bound == 0
    assert redis_client.llen(Keys(fleet_settings.key_prefix).history(branch.id)) == 0

    # From a thread of that loop's program (asyncio.to_thread), it runs.
    async def via_thread() -> list[Any]:
        results = await asyncio.to_thread(branch.act_sync, [call("add", a=20, b=22)])
        return [r.output for r in results]

    assert asyncio.run(via_thread()) == [42]
    assert fleet.loops_bound == 0


def test_act_sync_carries_the_callers_contextvars(fleet_settings: Settings) -> None:
    """The batch runs in a copy of the caller's context: what a hook on the dispatcher reads
    of a ContextVar is what the caller set, from the main thread and from another thread."""
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")
    seen: list[str] = []
    fleet = Fleet(fleet_settings)
    branch = Branch(fleet=fleet)
    branch.hooks.on(HookPoint.TOOL_PRE, lambda payload: seen.append(request_id.get()))

    request_id.set("main-thread")
    branch.act_sync(call("add", a=1, b=1))

    def in_thread() -> None:
        request_id.set("other-thread")
        branch.act_sync(call("add", a=2, b=2))

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(120)
    assert not thread.is_alive()
    assert seen == ["main-thread", "other-thread"]


def test_act_sync_raises_like_act_and_still_closes(fleet_settings: Settings) -> None:
    fleet = Fleet(fleet_settings)
    branch = Branch(fleet=fleet)
    with pytest.raises(MalformedRequestError):
        branch.act_sync([{"function": "add"}], suppress_errors=False)
    assert fleet.loops_bound == 0
    assert branch.messages == []
    assert [r.output for r in branch.act_sync(call("add", a=1, b=1))] == [2]


def test_one_fleet_in_two_loops_at_once_without_aclose(
    fleet_settings: Settings, redis_client: redis.Redis
) -> None:
    """The async counterpart: two threads each asyncio.run() a batch on the same fleet at
    the same time and never call aclose(); each share is closed when its loop ends."""
    fleet = Fleet(fleet_settings)
    ids: list[str] = []
    outputs: dict[int, list[Any]] = {}
    both_bound = threading.Barrier(2, timeout=60)

    async def scenario(n: int) -> None:
        ids.append(fleet.collector_id)  # binds this loop's share
        await asyncio.get_running_loop().run_in_executor(None, both_bound.wait)
        branch = Branch(fleet=fleet)
        results = await branch.act([call("sleep_async", seconds=0.2), call("echo", value=n)])
        outputs[n] = [r.output for r in results]

    threads = [threading.Thread(target=asyncio.run, args=(scenario(n),)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert outputs == {0: [0.2, 0], 1: [0.2, 1]}
    assert len(set(ids)) == 2  # one dispatcher id (and reply list) per loop
    assert fleet.loops_bound == 0
    assert not any(_alive(redis_client, fleet, i) for i in ids)


def test_a_loop_closed_by_hand_closes_the_fleet_first(fleet_settings: Settings) -> None:
    """The rule that remains: a loop run and closed by hand (no asyncio.run, so no
    shutdown_asyncgens) awaits fleet.aclose() before loop.close()."""
    fleet = Fleet(fleet_settings)

    async def scenario() -> list[Any]:
        try:
            return [r.output for r in await Branch(fleet=fleet).act(call("add", a=1, b=2))]
        finally:
            await fleet.aclose()

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(scenario()) == [3]
    finally:
        loop.close()
    assert fleet.loops_bound == 0


def test_a_loop_closed_by_hand_without_aclose_is_named_and_forgotten(
    fleet_settings: Settings,
) -> None:
    """Break the rule, and the fleet says so when it next binds, forgets that share and works
    on. In a subprocess: the forgotten share's tasks are destroyed pending, which Python
    reports on stderr when they are collected (the cost the rule avoids)."""
    code = """
import asyncio, logging, sys
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.settings import Settings
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
fleet = Fleet(Settings(broker_url=sys.argv[1], tools=("tests.support.sample_tools",)))
loop = asyncio.new_event_loop()
add = {"function": "add", "arguments": {"a": 1, "b": 2}}
first = loop.run_until_complete(Branch(fleet=fleet).act(add))
loop.close()
print("bound after the hand-closed loop:", fleet.loops_bound)
again = Branch(fleet=fleet).act_sync({"function": "add", "arguments": {"a": 2, "b": 3}})
print("outputs:", first[0].output, again[0].output, "bound:", fleet.loops_bound)
"""
    done = subprocess.run(
        [sys.executable, "-c", code, fleet_settings.broker_url],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "bound after the hand-closed loop: 1" in done.stdout
    assert "closed without 'await fleet.aclose()'" in done.stdout
    assert "outputs: 3 5 bound: 0" in done.stdout
