"""Chaos for the fleet-wide controls and the effect key, with real processes.

- A concurrency cap across two hosts (two sync workers, each in a network namespace of its own,
  the set-up of test_chaos_partition.py) while one host's worker is SIGKILLed holding slots:
  the cap holds throughout (the tools' own side channel and the slot set both say so), the dead
  worker's slots come back when their leases lapse, none is left once every call has ended,
  and no call is lost.
- A ``read_only=True`` tool whose worker is SIGKILLed mid-run runs again on a survivor, as an
  ``idempotent=True`` one does, and both runs see the same effect key.
- A dispatcher SIGKILLed mid-batch and ``recover``: the call ran once, under the key its
  recorded call has, and the model's replay of its tool_call_id gets that key back.

Each test has its own redis-server. Run with ``pytest -m chaos``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from tests.support.act_process import act_argv
from tests.support.chaos_support import (
    Ledger,
    act_through,
    broker_fixture,
    chaos_calls,
    group_pids,
    judge,
    sigkill_child_when,
    stored_branch,
)
from tests.support.fleet import REPO_ROOT, WorkerProcess, start_worker
from tests.support.netns import Host, host_pair
from tests.support.overlap import most_at_once
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until, until_async
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.accept.context import call_id_for
from toolfleet.dispatcher.history.recover import recover_branch
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

pytestmark = pytest.mark.chaos

TOOLS = ("tests.support.limit_tools",)
CAP = 2  # max_concurrency of capped_chaos and capped_chaos_once
LIMIT_S = 55.0

broker = broker_fixture(persist=False)


@pytest.fixture()
def hosts() -> Iterator[tuple[Host, Host]]:
    with host_pair("10.215", "10.216") as pair:
        yield pair


def _runs(times: Path, killed: set[int], killed_at: float) -> dict[str, list[tuple[float, float]]]:
    """Each function's runs as (start, end) from the tools' own side channel; a run whose
    process was killed ends when it was killed."""
    open_runs: dict[tuple[int, int], tuple[str, float]] = {}
    runs: dict[str, list[tuple[float, float]]] = {}
    for line in times.read_text().splitlines():
        phase, token, at, pid, _host, function = line.split()
        if phase == "S":
            open_runs[(int(token), int(pid))] = (function, float(at))
        else:
            function, started = open_runs.pop((int(token), int(pid)))
            runs.setdefault(function, []).append((started, float(at)))
    for (_token, pid), (function, started) in open_runs.items():
        assert pid in killed, f"a run of {function} in live process {pid} never ended"
        runs.setdefault(function, []).append((started, killed_at))
    return runs


def test_a_cap_holds_across_two_hosts_while_a_worker_holding_slots_is_killed(
    hosts: tuple[Host, Host], tmp_path: Path
) -> None:
    a, b = hosts
    server = PrivateRedis(persist=False, also_bind=(a.outer_ip, b.outer_ip))
    server.start()
    workers: list[WorkerProcess] = []
    try:

        def start(host: Host, name: str) -> WorkerProcess:
            return start_worker(
                "sync",
                redis_url=f"redis://{host.outer_ip}:{server.port}/0",
                tools=TOOLS,
                concurrency=2,
                hostname=f"controls-{name}@{host.netns}",
                env={"TOOLFLEET_VISIBILITY_TIMEOUT_S": "4", "CHAOS_HOST": name},
                prefix=("ip", "netns", "exec", host.netns),
            )

        with ThreadPoolExecutor(2) as pool:
            workers += list(pool.map(start, (a, b), ("a", "b")))
        _cap_run(server, workers, tmp_path)
    finally:
        for worker in workers:
            worker.stop(timeout_s=5)
        server.kill()


def _cap_run(server: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    functions = ("capped_chaos", "capped_chaos_once")  # not idempotent, read-only
    n = 16
    requests = chaos_calls(ledger, functions, n, lambda i: 0.6 + (i % 3) / 5)
    settings = Settings(broker_url=server.url, tools=TOOLS, reconcile_grace_s=1.0)
    slot_keys = [Keys().slots(f, "*") for f in functions]
    samples: list[tuple[int, ...]] = []
    killed: set[int] = set()
    killed_at: list[float] = []

    def running_on_a() -> bool:
        marks = ledger.marks()
        return any(
            host == "a" and phase == "S" and "E" not in marks[token]
            for phase, token, _, host in ledger.lines()
        )

    async def chaos(branch: Branch, task: asyncio.Future[list[ActionResponseModel]]) -> None:
        client = aioredis.Redis.from_url(server.url)

        async def sample() -> None:  # the slot sets, every 20 ms, for the whole batch
            while not task.done():
                samples.append(tuple([int(await client.zcard(k)) for k in slot_keys]))
                await asyncio.sleep(0.02)

        sampler = asyncio.ensure_future(sample())
        try:
            await until_async(
                lambda: ledger.count("E") >= 2 and running_on_a(),
                timeout_s=30,
                what="a capped call running on host A",
                while_running=task,
            )
            killed.update(group_pids(workers[0].pid))
            killed_at.append(time.time())
            workers[0].kill()
            await asyncio.shield(task)
        finally:
            await sampler
            await client.aclose()

    started = time.monotonic()
    branch_id, results, elapsed_s = asyncio.run(
        act_through(settings, requests, chaos, limit_s=LIMIT_S)
    )
    stored = asyncio.run(stored_branch(settings, branch_id))
    verdict = judge(requests, results, stored, ledger, killed_pids=killed)
    runs = _runs(Path(str(ledger.path) + ".times"), killed, killed_at[0])
    peaks = {f: most_at_once((s for s, _ in r), (e for _, e in r)) for f, r in runs.items()}
    with redis.Redis.from_url(server.url) as client:
        # No slot leaked: every set is empty soon after the last call ended (a dead worker's
        # slot is given back by its call's redelivery, or lapses with its lease).
        until(
            lambda: all(client.zcard(k) == 0 for k in slot_keys),
            timeout_s=12,
            what="every slot set to empty",
        )
    print(json.dumps({"chaos": "cap-two-hosts-kill", "elapsed_s": round(elapsed_s, 1),
                      "peaks": peaks, "samples": len(samples), **verdict.summary()}))  # fmt: skip
    assert time.monotonic() - started < LIMIT_S + 15
    verdict.assert_clean()
    assert any(pid in killed for pid in _pids_of(ledger, "a")), "nothing ran on host A"
    # The cap held throughout: in what the tools saw, and in every sample of the slot sets.
    assert set(peaks) == set(functions) and max(peaks.values()) <= CAP, peaks
    assert samples and max(max(s) for s in samples) <= CAP
    assert {h for *_, h in ledger.lines()} == {"a", "b"}  # both hosts ran capped calls


def _pids_of(ledger: Ledger, host: str) -> set[int]:
    return {pid for _, _, pid, h in ledger.lines() if h == host}


def _openai_call(tool_call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": tool_call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _keys_and_pids(path: Path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    return [(k, int(p)) for k, p in (line.split() for line in path.read_text().splitlines())]


def test_a_read_only_tool_reruns_after_its_worker_is_killed_under_the_same_effect_key(
    broker: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    env = {"TOOLFLEET_VISIBILITY_TIMEOUT_S": "2"}
    doomed = start_worker("sync", redis_url=broker.url, tools=TOOLS, concurrency=1, env=env)
    workers.append(doomed)
    settings = Settings(broker_url=broker.url, tools=TOOLS)
    path = tmp_path / "keys"
    turn = [_openai_call("call_ro", "read_only_key", path=str(path), seconds=60)]
    killed: set[int] = set()

    async def scenario() -> tuple[str, ActionResponseModel, float]:
        async with Fleet(settings) as fleet:
            branch = Branch(fleet=fleet)
            started = time.monotonic()
            task = asyncio.ensure_future(branch.act(turn, call_params=CallParams(deadline_s=45)))
            await until_async(
                lambda: _keys_and_pids(path), timeout_s=20, what="the first run", while_running=task
            )
            workers.append(
                await asyncio.to_thread(
                    start_worker, "sync", redis_url=broker.url, tools=TOOLS, env=env
                )
            )
            killed.update(group_pids(doomed.pid))
            doomed.kill()
            (result,) = await task
            return branch.id, result, time.monotonic() - started

    branch_id, result, elapsed_s = asyncio.run(scenario())
    assert elapsed_s < 45
    assert result.status is EventStatus.COMPLETED, result.error
    runs = _keys_and_pids(path)
    assert len(runs) == 2, runs  # run again after its worker was lost ...
    assert runs[0][1] in killed and runs[1][1] not in killed
    key = call_id_for(branch_id, "call_ro")
    assert [k for k, _ in runs] == [key, key] == [result.output, result.call_id]  # ... same key


def test_the_effect_key_survives_a_dead_dispatcher_and_recover(
    broker: PrivateRedis, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    workers.append(start_worker("sync", redis_url=broker.url, tools=TOOLS, concurrency=1))
    settings = Settings(broker_url=broker.url, tools=TOOLS, reconcile_grace_s=1.0)
    path = tmp_path / "keys"
    turn = [_openai_call("call_rec", "read_only_key", path=str(path), seconds=2)]
    branch_id = str(uuid.uuid4())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    sigkill_child_when(
        act_argv(broker.url, branch_id, ("tests.support.limit_tools",), turn),
        env,
        lambda: _keys_and_pids(path),
        timeout_s=30,
        what="the tool to start",
    )

    async def recover_then_replay() -> tuple[list[EventRecord], list[ActionResponseModel]]:
        async with Fleet(settings) as fleet:
            await recover_branch(branch_id, fleet, wait_s=20, include_live=True)
            stored = await Branch.load(branch_id, fleet=fleet)
            events = stored.events
            return events, await stored.act(turn)  # the model sends the same turn again

    events, (replayed,) = asyncio.run(asyncio.wait_for(recover_then_replay(), 50))
    key = call_id_for(branch_id, "call_rec")
    assert [e.call_id for e in events] == [key]
    assert events[0].execution["status"] == "completed"
    assert _keys_and_pids(path)[0][0] == key and len(_keys_and_pids(path)) == 1  # ran once
    assert replayed.status is EventStatus.COMPLETED and replayed.output == key
    assert len(_keys_and_pids(path)) == 1  # the replay was answered from the record
