"""Helpers for the reliability, cancellation, deadline and secrets tests (issue 7).

Not a test module: conditions with deadlines, a private redis-server that a test may stop and
restart (the machine's Redis on 6379 is never touched), and raw publishing through kombu.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import redis

from tests.support.fleet import wait_for

__all__ = ["PrivateRedis", "free_port", "kill_pid", "private_redis", "wait_until"]


wait_until = wait_for  # one deadline-bounded poll for every test helper


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrivateRedis:
    """A redis-server of this test's own on 127.0.0.1:<free port>, stoppable and restartable."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="toolfleet-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def start(self) -> None:
        # No persistence: a restart is a broker that lost its state, the harder case.
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._answers, timeout_s=10, what=f"redis-server on port {self.port}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.kill()  # SIGKILL: the broker vanishes, as in a crash
        self.proc.wait(timeout=10)
        self.proc = None

    def _answers(self) -> bool:
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False


@contextlib.contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def kill_pid(pid: int) -> None:
    """SIGKILL one process by PID; a process already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
