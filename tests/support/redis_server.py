"""A redis-server of the test's own, started by the launcher toolfleet ships (EmbeddedRedis).

It listens on ``host``:<free port> (and ``also_bind``), so a test may crash it (SIGKILL), stall
it (SIGSTOP) and start it again on the same port; the machine's Redis is never touched. With
``persist`` every write goes to an append-only file fsynced per write, so a crash and restart
is a broker that came back with its data (how Redis is deployed); without it a restart is a
broker that lost everything. ``fsync="everysec"`` fsyncs once a second instead (Redis's
default): a SIGKILL loses nothing (each write reaches the kernel before its reply), a machine
crash loses up to the last second (``aof_files``: what a test truncates to show that).
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

from toolfleet.embedded.processes import free_port
from toolfleet.embedded.redis_server import EmbeddedRedis

__all__ = ["PrivateRedis"]

# EmbeddedRedis ties a server's life to the thread that starts it (Linux's parent-death
# signal, so an embedded fleet never outlives toolfleet). Tests restart brokers from
# asyncio.to_thread, whose threads end with their event loop: every start runs on this one
# thread instead, which lives as long as the test process.
_STARTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="private-redis-start")


class PrivateRedis:
    """A redis-server on ``host``:``port`` (a free one unless given), handled by its PID."""

    def __init__(
        self,
        port: int | None = None,
        *,
        persist: bool = False,
        fsync: str = "always",
        host: str = "127.0.0.1",
        also_bind: Sequence[str] = (),
        client_timeout_s: float = 2.0,
        ready_timeout_s: float = 10.0,
        executable: str = "",
    ) -> None:
        self.host = host
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="toolfleet-redis-"))
        self.client_timeout_s = client_timeout_s
        self.fsync = fsync
        self._server = EmbeddedRedis(
            run_dir=self.dir,
            port=self.port,
            # more addresses it listens on (e.g. veth ends reached from other namespaces)
            bind=(host, *also_bind),
            append_only=persist,
            append_fsync=fsync,
            ready_timeout_s=ready_timeout_s,
            executable=executable,
        )

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int:
        pid = self._server.pid
        assert pid is not None, "the redis-server is not running"
        return pid

    def aof_files(self) -> list[Path]:
        """The append-only files (``appendonly.aof``, or Redis 7's appendonlydir/*.aof), the
        one written to last at the end."""
        files = [*self.dir.glob("*.aof"), *self.dir.glob("appendonlydir/*.aof")]
        return sorted(files, key=lambda p: p.stat().st_mtime_ns)

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(
            host=self.host, port=self.port, db=db, socket_timeout=self.client_timeout_s
        )

    def start(self) -> None:
        """Start it (again, on the same port and data directory) once it answers PING."""
        _STARTER.submit(self._server.start).result()

    def kill(self) -> None:
        """SIGKILL: the broker vanishes, as in a crash, not a shutdown. Idempotent."""
        self.resume()
        self._server.kill()

    def pause(self) -> None:
        """SIGSTOP: the broker stalls; connections stay open and nothing answers."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._server.pid is not None:
            os.kill(self._server.pid, signal.SIGCONT)
