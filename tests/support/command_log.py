"""Every command a Redis server runs on one database, with its connection and time (MONITOR)."""

from __future__ import annotations

import threading
import uuid

import redis

__all__ = ["CommandLog"]


class CommandLog:
    """Every command the server runs on ``db``, in the order it ran them (Redis MONITOR)."""

    def __init__(self, url: str, db: int) -> None:
        self._client = redis.Redis.from_url(url)
        self._db = db
        self._stop = f"stop-command-log-{uuid.uuid4().hex}"
        self.commands: list[str] = []
        self.clients: list[str] = []  # the connection (client port) of each command
        self.times: list[float] = []  # the server's clock when it ran each command
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def __enter__(self) -> CommandLog:
        self._monitor = self._client.monitor().__enter__()  # MONITOR is on once this returns
        self._thread.start()
        return self

    def _listen(self) -> None:
        for info in self._monitor.listen():
            if self._stop in info["command"]:
                return
            if info["db"] == self._db:
                self.commands.append(info["command"])
                self.clients.append(info["client_port"])
                self.times.append(float(info["time"]))

    def __exit__(self, *exc: object) -> None:
        self._client.echo(self._stop)
        self._thread.join(timeout=30)
        self._monitor.__exit__()
        self._client.close()
        assert not self._thread.is_alive(), "MONITOR never saw the stop command"
