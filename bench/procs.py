"""Worker subprocesses the benchmark starts itself, waits for, and stops by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from tests.support.waiting import until

__all__ = ["WorkerProcess", "repo_root", "toolfleet_worker"]

_READY_MARK = b" ready."


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


class WorkerProcess:
    """One Celery worker command, started in its own session so its pool children go with it.

    Ready = the worker logged ``ready.`` (Celery's own line, printed once consumers are up),
    which works for any Celery-based worker without needing its app object here.
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        name: str = "worker",
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.argv = list(argv)
        self.env = {**os.environ, **(env or {})}
        # Workers import bench.* and the project packages from the checkout.
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(repo_root()), self.env.get("PYTHONPATH", "")) if p
        )
        self.name = name
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")[1])

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"worker {self.name!r} is not started; call start() first")
        return self.proc.pid

    def start(self) -> WorkerProcess:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(repo_root()),
                start_new_session=True,
            )
        proc = self.proc
        with contextlib.suppress(TimeoutError):  # polling a log file; there is no event
            until(
                lambda: _READY_MARK in self.log_path.read_bytes() or proc.poll() is not None,
                timeout_s=self.ready_timeout_s,
            )
        if _READY_MARK in self.log_path.read_bytes():
            return self
        tail = self.log_path.read_bytes()[-2000:].decode(errors="replace")
        self.stop()
        raise RuntimeError(
            f"worker {self.name!r} ({' '.join(self.argv)}) did not become ready within "
            f"{self.ready_timeout_s:g}s; last log lines:\n{tail}"
        )

    def stop(self, timeout_s: float = 15.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL of the worker's own process group."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self._cleanup()
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        # The session was created for this worker, so its group is exactly its pool children.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout_s)
        self._cleanup()

    def _cleanup(self) -> None:
        if os.environ.get("BENCH_KEEP_LOGS"):
            print(f"bench: {self.name} log kept at {self.log_path}", file=sys.stderr)
            return
        self.log_path.unlink(missing_ok=True)

    def rss_kb(self) -> int:
        """Resident memory of the worker and its pool children, in KiB (Linux /proc)."""
        total = 0
        for pid in _session_pids(self.pid):
            total += _status_field_kb(pid, "VmRSS")
        return total

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def toolfleet_worker(
    kind: str, concurrency: int, tools: str, name: str, env: dict[str, str]
) -> WorkerProcess:
    """A ``toolfleet worker`` process serving the module ``tools``, not yet started; ``env``
    holds its TOOLFLEET_* settings (the broker URL at least)."""
    argv = [
        sys.executable, "-m", "toolfleet.cli", "worker", "--kind", kind,
        "--concurrency", str(concurrency), "--tools", tools,
        "--hostname", f"{name}@%h", "--loglevel", "INFO",
    ]  # fmt: skip
    return WorkerProcess(argv, env=env, name=name)


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) == sid:
                pids.append(int(entry))
        except (ProcessLookupError, PermissionError):
            continue
    return pids


def _status_field_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except FileNotFoundError:
        return 0
    return 0
