"""Start and stop real ``toolfleet worker`` processes for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from celery import Celery

from workers.app import create_app
from workers.settings import Settings

__all__ = ["REPO_ROOT", "WorkerProcess", "start_worker", "wait_for"]

REPO_ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], *, timeout_s: float, interval_s: float = 0.05, what: str = ""
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what or predicate}")
        time.sleep(interval_s)


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
        """SIGTERM (warm shutdown), wait, then SIGKILL the whole group. Returns the exit code."""
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(10)
        # Prefork children left behind by a killed parent share its process group.
        self._signal(signal.SIGKILL)
        if self._app is not None:
            self._app.close()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the worker and its children at once: a crash, not a shutdown."""
        self._signal(signal.SIGKILL)
        self.process.wait(10)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def start_worker(
    kind: str,
    *,
    redis_url: str,
    tools: Sequence[str] = ("tests.sample_tools",),
    concurrency: int | None = None,
    env: Mapping[str, str] | None = None,
    hostname: str | None = None,
    ready_timeout_s: float = 60.0,
    loglevel: str = "INFO",
) -> WorkerProcess:
    """Run ``toolfleet worker --kind <kind>`` against ``redis_url``; return once it answers
    a ping. Extra ``TOOLFLEET_*`` settings go in ``env``."""
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
    command = [str(script)] if script.exists() else [sys.executable, "-m", "dispatcher.cli"]
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
    settings_env = {k: v for k, v in full_env.items() if k.startswith("TOOLFLEET_")}
    app = create_app(Settings.from_env(settings_env))
    worker = WorkerProcess(kind, hostname, process, Path(log_name), app)
    try:
        wait_for(
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


