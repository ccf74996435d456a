"""Start and stop real ``toolfleet worker`` processes for tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from celery import Celery

from tests.support.waiting import until
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.send.enqueue import publish_calls
from toolfleet.embedded.processes import reap_with_this_process, release_group
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.messages import ActionRequest, ActionResponse
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage, CallResult
from toolfleet.workers.app import create_app
from toolfleet.workers.registry import Registry
from toolfleet.workers.registry import registry as default_registry

__all__ = [
    "REPO_ROOT",
    "WorkerProcess",
    "act_on",
    "assert_linked_pairs",
    "call",
    "collect_replies",
    "make_call",
    "own_queues",
    "private_workers",
    "run",
    "run_calls",
    "start_worker",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@dataclass
class WorkerProcess:
    """A ``toolfleet worker`` subprocess in its own process group."""

    kind: str
    hostname: str
    process: subprocess.Popen[bytes]
    log_path: Path
    _app: Celery | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def ping(self, timeout_s: float = 0.5) -> bool:
        assert self._app is not None
        replies = self._app.control.ping(destination=[self.hostname], timeout=timeout_s)
        return any(self.hostname in reply for reply in replies)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (warm shutdown), wait, then SIGKILL the whole group. Returns the exit code.

        The log file is removed unless TOOLFLEET_TEST_KEEP_LOGS is set."""
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(10)
        # Prefork children left behind by a killed parent share its process group.
        self._signal(signal.SIGKILL)
        release_group(self.process.pid)
        if self._app is not None:
            self._app.close()
        if not os.environ.get("TOOLFLEET_TEST_KEEP_LOGS"):
            self.log_path.unlink(missing_ok=True)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the worker and its children at once: a crash, not a shutdown."""
        self._signal(signal.SIGKILL)
        self.process.wait(10)
        release_group(self.process.pid)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def own_queues(
    fleet_settings: Settings, label: str, **update: Any
) -> tuple[Settings, dict[str, str]]:
    """``fleet_settings`` on a sync and an async queue of their own (named after ``label`` and a
    random suffix), with ``update``; and the ``TOOLFLEET_*`` environment that puts a worker on
    those queues with the same result backend."""
    suffix = f"{label}-{uuid.uuid4().hex[:8]}"
    settings = fleet_settings.model_copy(
        update={
            "sync_queue": f"toolfleet.sync.{suffix}",
            "async_queue": f"toolfleet.async.{suffix}",
            **update,
        }
    )
    env = {
        "TOOLFLEET_RESULT_BACKEND": fleet_settings.result_backend or "",
        "TOOLFLEET_SYNC_QUEUE": settings.sync_queue,
        "TOOLFLEET_ASYNC_QUEUE": settings.async_queue,
    }
    return settings, env


@contextlib.contextmanager
def private_workers(
    redis_url: str,
    label: str,
    *,
    tools: Sequence[str] = ("tests.support.sample_tools",),
    concurrency: Mapping[str, int | None] | None = None,
    worker_env: Mapping[str, str] | None = None,
) -> Iterator[dict[str, str]]:
    """One worker per kind in ``concurrency`` (default: a sync and an async one), on queues
    and a key prefix of their own, started side by side and stopped afterwards. Yields the
    ``TOOLFLEET_*`` environment (broker URL included) that reaches them; ``worker_env`` is
    given to the workers only."""
    tag = f"{label}-{uuid.uuid4().hex[:8]}"
    env = {
        "TOOLFLEET_BROKER_URL": redis_url,
        "TOOLFLEET_SYNC_QUEUE": f"toolfleet.sync.{tag}",
        "TOOLFLEET_ASYNC_QUEUE": f"toolfleet.async.{tag}",
        "TOOLFLEET_KEY_PREFIX": f"tf-{tag}",
    }
    kinds = dict(concurrency) if concurrency is not None else {"sync": None, "async": None}
    started: list[WorkerProcess] = []

    def start(kind: str) -> WorkerProcess:
        worker = start_worker(
            kind,
            redis_url=redis_url,
            tools=tools,
            concurrency=kinds[kind],
            env={**env, **(worker_env or {})},
        )
        started.append(worker)
        return worker

    try:
        with ThreadPoolExecutor(len(kinds)) as pool:
            list(pool.map(start, kinds))
        yield env
    finally:
        for worker in started:
            worker.stop(timeout_s=10)


def start_worker(
    kind: str,
    *,
    redis_url: str,
    tools: Sequence[str] = ("tests.support.sample_tools",),
    concurrency: int | None = None,
    env: Mapping[str, str] | None = None,
    hostname: str | None = None,
    ready_timeout_s: float = 60.0,
    loglevel: str = "INFO",
    prefix: Sequence[str] = (),
    options: Sequence[str] = (),
) -> WorkerProcess:
    """Run ``toolfleet worker --kind <kind>`` against ``redis_url``; return once it answers
    a ping. Extra ``TOOLFLEET_*`` settings go in ``env``; ``prefix`` runs it through another
    command (``ip netns exec NAME``, which execs it: the PID stays the worker's); ``options``
    go after the command's own."""
    if concurrency is None:
        concurrency = 4 if kind == "sync" else 500
    hostname = hostname or f"{kind}-{uuid.uuid4().hex[:8]}@localhost"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    full_env.update(
        {
            "TOOLFLEET_BROKER_URL": redis_url,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
            "PYTHONUNBUFFERED": "1",
        }
    )
    full_env.update(env or {})
    script = Path(sys.executable).parent / "toolfleet"
    command = [*prefix]
    command += [str(script)] if script.exists() else [sys.executable, "-m", "toolfleet.cli"]
    command += [
        "worker",
        "--kind",
        kind,
        "--concurrency",
        str(concurrency),
        "--hostname",
        hostname,
        "--loglevel",
        loglevel,
    ]
    if tools:
        command += ["--tools", ",".join(tools)]
    command += options
    log_fd, log_name = tempfile.mkstemp(prefix=f"toolfleet-{kind}-worker-", suffix=".log")
    try:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=full_env,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so stop() reaches prefork children
        )
    finally:
        os.close(log_fd)
    # The worker and its pool end with this process however it ends (Ctrl-C on pytest -n 3,
    # a SIGKILLed test run): the embedded fleet's reaper kills the group if stop() never ran.
    reap_with_this_process(process.pid)
    settings_env = {k: v for k, v in full_env.items() if k.startswith("TOOLFLEET_")}
    app = create_app(Settings.from_env(settings_env))
    worker = WorkerProcess(kind, hostname, process, Path(log_name), app)
    try:
        until(
            lambda: _ready(worker),
            timeout_s=ready_timeout_s,
            interval_s=0.2,
            what=f"{kind} worker {hostname} to answer a ping",
        )
    except BaseException:
        worker.stop(timeout_s=5)
        raise
    return worker


def _ready(worker: WorkerProcess) -> bool:
    if worker.process.poll() is not None:
        raise RuntimeError(
            f"{worker.kind} worker exited with {worker.process.returncode} before it was "
            f"ready; its log:\n{worker.log()[-4000:]}"
        )
    return worker.ping()


def make_call(
    function: str,
    arguments: dict[str, Any] | None = None,
    *,
    reply_to: str | None = None,
    call_id: str | None = None,
    attempt: int = 0,
    timeout_s: float | None = None,
) -> CallMessage:
    """A CallMessage with a fresh call_id (uuid4)."""
    return CallMessage(
        call_id=call_id or str(uuid.uuid4()),
        function=function,
        arguments=arguments or {},
        reply_to=reply_to,
        attempt=attempt,
        timeout_s=timeout_s,
    )


def collect_replies(
    client: redis.Redis, reply_to: str, count: int, *, timeout_s: float
) -> list[CallResult]:
    """BLPOP ``count`` CallResults from ``reply_to``; fail after ``timeout_s`` overall."""
    results: list[CallResult] = []

    def all_arrived() -> bool:
        if len(results) < count:
            item: Any = client.blpop([reply_to], timeout=0.2)  # the wait is the pop itself
            if item is not None:
                results.append(CallResult.model_validate_json(item[1]))
        return len(results) >= count

    until(
        all_arrived,
        timeout_s=timeout_s,
        interval_s=0,
        what=lambda: f"{count} results on {reply_to} (only {len(results)} arrived)",
    )
    return results


def run_calls(
    app: Celery,
    client: redis.Redis,
    calls: Sequence[tuple[str, dict[str, Any]]],
    *,
    registry: Registry | None = None,
    timeout_s: float = 30.0,
) -> list[CallResult]:
    """Publish ``(function, arguments)`` calls and return their results in input order.

    A function missing from ``registry`` is published to the sync queue as if it were a
    sync tool, so a worker can be asked for a tool it does not have.
    """
    reg = registry or default_registry
    reply_to = f"toolfleet:reply:test-{uuid.uuid4().hex}"
    batch: list[tuple[CallMessage, Tool]] = []
    for function, arguments in calls:
        message = make_call(function, arguments, reply_to=reply_to)
        tool = (
            reg.get(function)
            if function in reg
            else Tool(func_callable=_missing, function=function)
        )
        batch.append((message, tool))
    publish_calls(app, batch)
    by_id = {
        r.call_id: r for r in collect_replies(client, reply_to, len(batch), timeout_s=timeout_s)
    }
    return [by_id[m.call_id] for m, _ in batch]


def _missing(**_: Any) -> None:
    raise AssertionError("a stand-in for a tool the worker does not know; never called")


def call(function: str, **arguments: Any) -> dict[str, Any]:
    """One action request envelope, as an agent's turn proposes it."""
    return {"function": function, "arguments": arguments}


def run(settings: Settings, scenario: Callable[[Fleet], Awaitable[T]], timeout_s: float = 60) -> T:
    """Run ``scenario(fleet)`` on a fresh event loop with a fleet closed afterwards; the
    timeout only catches a hang (tests assert their own, tighter times)."""

    async def main() -> T:
        fleet = Fleet(settings)
        try:
            return await asyncio.wait_for(scenario(fleet), timeout_s)
        finally:
            await fleet.aclose()

    return asyncio.run(main())


def act_on(
    settings: Settings, requests: list[dict[str, Any]], params: CallParams | None = None
) -> list[ActionResponseModel]:
    """One ``Branch.act(requests)`` on a fresh branch of a fleet of ``settings``."""

    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        return await Branch(fleet=fleet).act(requests, call_params=params)

    return run(settings, scenario)


def assert_linked_pairs(branch: Branch, results: Sequence[ActionResponseModel]) -> None:
    """History holds, per result and in input order, a request and its linked response,
    whose error is the result's."""
    messages = branch.messages
    assert len(messages) == 2 * len(results)
    for i, result in enumerate(results):
        request, response = messages[2 * i], messages[2 * i + 1]
        assert isinstance(request, ActionRequest) and isinstance(response, ActionResponse)
        assert request.content.action_response_id == response.id
        assert response.content.action_request_id == request.id
        assert response.content.error == result.error
