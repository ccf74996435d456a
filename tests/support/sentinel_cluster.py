"""A Redis Sentinel setup of the test's own: a primary, its replicas and three sentinels, each a
real ``redis-server`` on a free loopback port, each handled by its PID.

The primary and the replica keep an append-only file fsynced per write (``appendfsync
always``); the sentinels watch the primary as ``MASTER`` with quorum 2, call it down after
``down_after_ms`` without an answer and may start a new failover ``failover_timeout_ms``
later. ``kill_primary`` SIGKILLs whichever server is the primary now, and
``wait_for_failover`` returns the replica the sentinels promoted.
Not a test module.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import redis

from tests.support.waiting import until
from toolfleet.embedded.processes import free_port

__all__ = ["MASTER", "SentinelCluster"]

MASTER = "toolfleet-test-primary"
HOST = "127.0.0.1"


def _executable() -> str:
    found = shutil.which("redis-server")
    assert found, "redis-server is not on PATH"
    return found


class _Server:
    """One redis-server process: a data server or a sentinel."""

    def __init__(self, argv: list[str], port: int, directory: Path) -> None:
        self.argv, self.port, self.dir = argv, port, directory
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.dir / "server.log", "ab")
        try:
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        until(self._answers, timeout_s=15, what=f"redis-server on port {self.port}")

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"redis-server on {self.port} exited: {self.log()[-2000:]}")
        try:
            return bool(self.client(timeout_s=0.5).ping())
        except redis.RedisError:
            return False

    def client(self, timeout_s: float = 2.0) -> redis.Redis:
        return redis.Redis(
            host=HOST, port=self.port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )

    def log(self) -> str:
        path = self.dir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL by PID (a crash); idempotent."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


class SentinelCluster:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels on free loopback ports."""

    def __init__(
        self,
        *,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        quorum: int = 2,
        sentinels: int = 3,
        replicas: int = 1,
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="toolfleet-sentinel-"))
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.quorum, self.n_sentinels, self.n_replicas = quorum, sentinels, replicas
        self.data: list[_Server] = []
        self.sentinels: list[_Server] = []

    def _data_server(self, name: str, replica_of: int | None) -> _Server:
        port = free_port()
        directory = self.root / name
        directory.mkdir()
        argv = [_executable(), "--port", str(port), "--bind", HOST, "--dir", str(directory)]
        argv += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        argv += ["--protected-mode", "no"]
        if replica_of is not None:
            argv += ["--replicaof", HOST, str(replica_of)]
        return _Server(argv, port, directory)

    def _sentinel(self, index: int, primary_port: int) -> _Server:
        port = free_port()
        directory = self.root / f"sentinel{index}"
        directory.mkdir()
        config = directory / "sentinel.conf"
        config.write_text(
            f"port {port}\nbind {HOST}\ndir {directory}\nprotected-mode no\n"
            f"sentinel monitor {MASTER} {HOST} {primary_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {MASTER} 1\n"
        )
        return _Server([_executable(), str(config), "--sentinel"], port, directory)

    def start(self) -> SentinelCluster:
        primary = self._data_server("primary", None)
        primary.start()
        self.data = [primary]
        for index in range(self.n_replicas):
            replica = self._data_server(f"replica{index}", primary.port)
            replica.start()
            self.data.append(replica)
        until(
            lambda: self.replicas_in_sync(primary),
            timeout_s=15,
            what="the replica to sync with the primary",
        )
        for index in range(self.n_sentinels):
            sentinel = self._sentinel(index, primary.port)
            sentinel.start()
            self.sentinels.append(sentinel)
        until(self._sentinels_agree, timeout_s=20, what="every sentinel to see the others")
        return self

    def replicas_in_sync(self, server: _Server, replicas: int | None = None) -> bool:
        """Whether ``server`` has ``replicas`` (default: all but itself) replicas online."""
        wanted = len(self.data) - 1 if replicas is None else replicas
        info = server.client().info("replication")
        return int(info.get("connected_slaves", 0)) >= wanted and all(
            info.get(f"slave{i}", {}).get("state") == "online"
            for i in range(int(info.get("connected_slaves", 0)))
        )

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            state = sentinel.client().sentinel_master(MASTER)
            if int(state.get("num-other-sentinels", 0)) < self.n_sentinels - 1:
                return False
            if int(state.get("num-slaves", 0)) < self.n_replicas:
                return False
        return True

    @property
    def url(self) -> str:
        """The broker URL: every sentinel, ``;``-separated."""
        return ";".join(f"sentinel://{HOST}:{s.port}" for s in self.sentinels)

    def primary_port(self) -> int:
        """The primary's port as the first answering sentinel names it."""
        for sentinel in self.sentinels:
            if not sentinel.alive:
                continue
            try:
                _host, port = sentinel.client().sentinel_get_master_addr_by_name(MASTER)
                return int(port)
            except (redis.RedisError, TypeError):
                continue
        raise AssertionError("no sentinel names a primary")

    def server(self, port: int) -> _Server:
        return next(s for s in self.data if s.port == port)

    def primary(self) -> _Server:
        return self.server(self.primary_port())

    def kill_primary(self) -> _Server:
        """SIGKILL the current primary; return it."""
        victim = self.primary()
        victim.kill()
        return victim

    def wait_for_failover(self, old_port: int, timeout_s: float = 30.0) -> _Server:
        """The new primary, once every live sentinel names it and it answers as a primary."""

        def promoted() -> _Server | None:
            ports = set()
            for sentinel in self.sentinels:
                if not sentinel.alive:
                    continue
                _host, port = sentinel.client().sentinel_get_master_addr_by_name(MASTER)
                ports.add(int(port))
            if len(ports) != 1 or old_port in ports:
                return None
            server = self.server(ports.pop())
            role = server.client().info("replication").get("role")
            return server if role == "master" else None

        return until(promoted, timeout_s=timeout_s, interval_s=0.1, what="the failover")

    def stop(self) -> None:
        """Kill every process by PID and remove the directory."""
        for server in [*self.sentinels, *self.data]:
            server.kill()
        shutil.rmtree(self.root, ignore_errors=True)
