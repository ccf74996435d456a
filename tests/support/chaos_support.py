"""Helpers for the chaos tests: the ``broker`` fixture (a private redis-server a test can kill,
restart, pause and resume by PID); the tools' ledger; and the one verdict every chaos test
asserts.

Not a test module. The verdict counts, from the ledger the tools wrote themselves and from the
history stored in Redis (not the dispatcher's memory):

- lost: a call that did not end as the rules say it may (COMPLETED after it ran, or one of the
  failures the test allows — e.g. WorkerLostError for a non-idempotent call that did start);
- finished_rerun: a call that started again after a run of it had finished on a process that
  was not killed (a run whose process was killed after its tool ended but before it recorded
  the outcome is, to the fleet, a worker lost mid-call: an idempotent call then runs again,
  counted in ``rerun_after_lost_record``);
- rerun_not_idempotent: a non-idempotent call that started more than once;
- unpaired: a call without exactly one linked request/response pair in Redis history.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import REPO_ROOT, WorkerProcess, start_worker
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.messages import ActionRequest, ActionResponse
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

__all__ = [
    "CHAOS_TOOLS",
    "Chaos",
    "Ledger",
    "Verdict",
    "act_and_load",
    "act_through",
    "broker_fixture",
    "chaos_calls",
    "chaos_settings",
    "group_pids",
    "judge",
    "replace_a_worker",
    "sigkill_child_when",
    "start_chaos_worker",
    "stored_branch",
    "stored_results",
]

CHAOS_TOOLS = ("tests.support.chaos_tools",)


def broker_fixture(*, persist: bool) -> Any:
    """A ``broker`` fixture for a chaos module: a PrivateRedis of the test's own, killed
    after (``persist``: an append-only file, fsync per write)."""

    def broker() -> Iterator[PrivateRedis]:
        server = PrivateRedis(persist=persist, client_timeout_s=5, ready_timeout_s=15)
        server.start()
        yield server
        server.kill()

    return pytest.fixture(name="broker")(broker)


def chaos_settings(broker: PrivateRedis, **overrides: Any) -> Settings:
    """A dispatcher's settings on ``broker`` with the chaos tools: a 1 s reconcile grace (a
    lost call is settled soon) unless ``overrides`` say otherwise."""
    fields: dict[str, Any] = {"reconcile_grace_s": 1.0, **overrides}
    return Settings(broker_url=broker.url, tools=CHAOS_TOOLS, **fields)


def start_chaos_worker(
    kind: str, broker: PrivateRedis, concurrency: int, env: Mapping[str, str]
) -> WorkerProcess:
    """A real ``kind`` worker on ``broker`` serving the chaos tools."""
    return start_worker(
        kind, redis_url=broker.url, tools=CHAOS_TOOLS, concurrency=concurrency, env=env
    )


async def replace_a_worker(
    pool: list[WorkerProcess], rng: random.Random, start: Callable[[], WorkerProcess]
) -> set[int]:
    """SIGKILL a random worker of ``pool`` with its prefork children and put ``start()``'s
    fresh worker in its place; return every PID killed (the judge needs them)."""
    victim = pool.pop(rng.randrange(len(pool)))
    killed = group_pids(victim.pid)
    victim.kill()
    victim.stop(timeout_s=1)
    pool.append(await asyncio.to_thread(start))
    return killed


def sigkill_child_when(
    argv: Sequence[str],
    env: Mapping[str, str],
    ready: Callable[[], object],
    *,
    timeout_s: float,
    what: str,
) -> None:
    """Run ``python argv`` (a dispatcher acting on a batch) and SIGKILL it once ``ready()``;
    fail if it exits first. It is killed, by PID, whatever happens."""
    child = subprocess.Popen(
        [sys.executable, *argv],
        cwd=REPO_ROOT,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        until(lambda: child.poll() is not None or ready(), timeout_s=timeout_s, what=what)
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


class Ledger:
    """The side channel the chaos tools write: one ``S``/``E`` line per start/end of a run."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "ledger"

    def marks(self) -> dict[int, list[str]]:
        """Per token, its phases in the order they were written."""
        by_token: dict[int, list[str]] = defaultdict(list)
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                phase, token, *_ = line.split()
                by_token[int(token)].append(phase)
        return by_token

    def count(self, phase: str) -> int:
        return sum(marks.count(phase) for marks in self.marks().values())

    def lines(self) -> list[tuple[str, int, int, str]]:
        """Every mark in written order: (phase, token, pid, host)."""
        if not self.path.exists():
            return []
        marks: list[tuple[str, int, int, str]] = []
        for line in self.path.read_text().splitlines():
            phase, token, pid, host = line.split()
            marks.append((phase, int(token), int(pid), host))
        return marks


def group_pids(*pgids: int, live_only: bool = False) -> set[int]:
    """Every process now in the process groups ``pgids`` (a worker and its prefork
    children); ``live_only``: zombies (ended, not yet reaped) left out."""
    pids: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command: state, ppid, pgrp.
        if int(fields[2]) in pgids and not (live_only and fields[0] == "Z"):
            pids.add(int(stat.parent.name))
    return pids


def chaos_calls(
    ledger: Ledger, functions: Sequence[str], n: int, seconds: Callable[[int], float]
) -> list[dict[str, Any]]:
    """``n`` calls, token i to ``functions[i % len(functions)]``, sleeping ``seconds(i)``."""
    return [
        {
            "function": functions[i % len(functions)],
            "arguments": {"ledger": str(ledger.path), "token": i, "seconds": seconds(i)},
        }
        for i in range(n)
    ]


@dataclass
class Verdict:
    calls: int
    lost: list[str] = field(default_factory=list)
    finished_rerun: list[int] = field(default_factory=list)
    rerun_not_idempotent: list[int] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    # Informational: idempotent calls run again after their worker was lost (allowed), and
    # calls whose run was cut short (a start without an end).
    reruns: int = 0
    cut_short: int = 0
    claimed_not_run: int = 0
    rerun_after_lost_record: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "lost": len(self.lost),
            "finished_rerun": len(self.finished_rerun),
            "rerun_not_idempotent": len(self.rerun_not_idempotent),
            "unpaired": len(self.unpaired),
            "outcomes": self.outcomes,
            "reruns": self.reruns,
            "cut_short": self.cut_short,
            "claimed_not_run": self.claimed_not_run,
            "rerun_after_lost_record": self.rerun_after_lost_record,
        }

    def assert_clean(self) -> None:
        assert not self.lost, f"lost calls: {self.lost[:5]} ({self.summary()})"
        assert not self.finished_rerun, f"re-run after finishing: {self.finished_rerun[:5]}"
        assert not self.rerun_not_idempotent, (
            f"non-idempotent calls run twice: {self.rerun_not_idempotent[:5]}"
        )
        assert not self.unpaired, f"calls without one linked pair: {self.unpaired[:5]}"


def _error_name(result: ActionResponseModel) -> str:
    return (result.error or "").split(":", 1)[0]


def judge(
    requests: Sequence[dict[str, Any]],
    results: Sequence[ActionResponseModel],
    stored: Branch,
    ledger: Ledger,
    *,
    allowed_failures: Collection[str] = ("WorkerLostError",),
    never_started: Collection[str] = (),
    killed_pids: Collection[int] = (),
) -> Verdict:
    """Count every way the batch broke the promise (see the module docstring).

    A FAILED (or ABORTED) call is lost unless its error's class is in ``allowed_failures``;
    one whose class is in ``never_started`` must not have started at all (never enqueued,
    never taken). A WorkerLostError for a call whose tool never began (its worker died
    between claiming the call and starting the tool) is allowed — the record says the call
    may have run, the conservative answer — and counted in ``claimed_not_run``."""
    verdict = Verdict(calls=len(requests))
    marks = ledger.marks()
    runs: dict[int, list[tuple[str, int]]] = defaultdict(list)  # token -> (phase, pid)
    for phase, token, pid, _host in ledger.lines():
        runs[token].append((phase, pid))
    for i, (request, result) in enumerate(zip(requests, results, strict=True)):
        token = request["arguments"]["token"]
        phases = marks.get(token, [])
        verdict.outcomes[result.status.value] = verdict.outcomes.get(result.status.value, 0) + 1
        if result.status is EventStatus.COMPLETED:
            if "E" not in phases or result.output != token:
                verdict.lost.append(f"#{i} COMPLETED but its tool never finished: {phases}")
        elif result.status in (EventStatus.FAILED, EventStatus.ABORTED):
            name = _error_name(result)
            if name not in allowed_failures:
                verdict.lost.append(f"#{i} FAILED {result.error}")
            elif name in never_started and phases:
                verdict.lost.append(f"#{i} {name} but it ran: {result.error}")
            elif name == "WorkerLostError" and "S" not in phases:
                verdict.claimed_not_run += 1
        else:
            verdict.lost.append(f"#{i} ended {result.status.value}: {result.error}")
        verdict.reruns += max(0, phases.count("S") - 1)
        verdict.cut_short += phases.count("S") - phases.count("E")
        if "E" in phases and "S" in phases[phases.index("E") :]:
            ended_by = next(pid for phase, pid in runs[token] if phase == "E")
            if ended_by in killed_pids:
                verdict.rerun_after_lost_record += 1
            else:
                verdict.finished_rerun.append(token)
        if not request["function"].endswith("_once") and phases.count("S") > 1:
            verdict.rerun_not_idempotent.append(token)
    verdict.unpaired = _unpaired(stored, results)
    return verdict


def _unpaired(stored: Branch, results: Sequence[ActionResponseModel]) -> list[str]:
    """Calls of ``results`` without exactly one linked pair, in input order, in ``stored``."""
    messages = stored.messages
    problems: list[str] = []
    if len(messages) != 2 * len(results):
        problems.append(f"history holds {len(messages)} messages for {len(results)} calls")
    events = {e.call_id: e for e in stored.events}
    for i, result in enumerate(results):
        if 2 * i + 1 >= len(messages):
            problems.append(f"#{i} has no pair")
            continue
        request, response = messages[2 * i], messages[2 * i + 1]
        linked = (
            isinstance(request, ActionRequest)
            and isinstance(response, ActionResponse)
            and request.content.action_response_id == response.id
            and response.content.action_request_id == request.id
            and response.content.error == result.error
        )
        if not linked:
            problems.append(f"#{i} request/response not linked in input order")
        event = events.get(result.call_id or "")
        if event is None or event.execution["status"] != result.status.value:
            problems.append(f"#{i} event missing or not {result.status.value}")
    if len(events) != len(stored.events):
        problems.append("a call has more than one event")
    return problems


def stored_results(stored: Branch) -> list[ActionResponseModel]:
    """Each call's outcome as the stored history tells it (for a batch whose dispatcher died,
    so no act() returned one): input order, from each response and its call's event."""
    status_of = {e.call_id: EventStatus(e.execution["status"]) for e in stored.events}
    results: list[ActionResponseModel] = []
    for message in stored.messages:
        if isinstance(message, ActionResponse):
            content = message.content
            results.append(
                ActionResponseModel(
                    function=content.function,
                    arguments=content.arguments,
                    output=content.output,
                    error=content.error,
                    call_id=content.call_id,
                    status=status_of.get(content.call_id or "", EventStatus.PENDING),
                )
            )
    return results


async def stored_branch(settings: Settings, branch_id: str) -> Branch:
    """The branch as Redis holds it, read by a fresh fleet (not the dispatcher's memory)."""
    async with Fleet(settings) as fleet:
        return await Branch.load(branch_id, fleet=fleet)


Chaos = Callable[[Branch, "asyncio.Future[list[ActionResponseModel]]"], Awaitable[None]]


async def act_through(
    settings: Settings,
    requests: Sequence[dict[str, Any]],
    chaos: Chaos,
    *,
    limit_s: float,
    call_params: CallParams | None = None,
) -> tuple[str, list[ActionResponseModel], float]:
    """Run one act() of ``requests`` while ``chaos(branch, task)`` breaks things; return the
    branch id, the results and how long act() took. No batch deadline is set, so a call the
    fleet loses would hang act(): ``limit_s`` (from the start) turns that into a failure."""
    async with Fleet(settings) as fleet:
        branch = Branch(fleet=fleet)
        started = time.monotonic()
        task = asyncio.ensure_future(branch.act(list(requests), call_params=call_params))
        try:
            await chaos(branch, task)
            left_s = max(1.0, limit_s - (time.monotonic() - started))
            try:
                results = await asyncio.wait_for(asyncio.shield(task), left_s)
            except TimeoutError:
                raise AssertionError(
                    f"act() had not returned {limit_s:g}s after it started"
                ) from None
        finally:
            if not task.done():
                task.cancel()
        return branch.id, results, time.monotonic() - started


def act_and_load(
    settings: Settings,
    requests: Sequence[dict[str, Any]],
    chaos: Chaos,
    *,
    limit_s: float,
    call_params: CallParams | None = None,
) -> tuple[list[ActionResponseModel], Branch, float]:
    """``act_through`` from sync code, then the branch as Redis holds it: the results, the
    stored branch and how long act() took."""
    branch_id, results, elapsed_s = asyncio.run(
        act_through(settings, requests, chaos, limit_s=limit_s, call_params=call_params)
    )
    return results, asyncio.run(stored_branch(settings, branch_id)), elapsed_s
