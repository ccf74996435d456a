"""Task events flow only while a monitor watches (C10, at no cost otherwise): a real worker, a real
``toolfleet flower``, a real Celery event receiver, on a private Redis.

With the default ``TOOLFLEET_TASK_EVENTS=monitor`` a call made with nobody watching sends no
task event; ``toolfleet flower`` turns them on at once (enable_events), Flower then shows each
call as ``tool:<function>``; when Flower leaves, the worker's lease lapses and events stop.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from tests.support.fleet import WorkerProcess, call, run, start_worker
from tests.support.flower import http_get, start_flower, stop_flower
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until
from toolfleet.dispatcher import Branch
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.workers.app import create_app
from toolfleet.workers.monitor import live_leases, monitor_key

LEASE_S = 2.0


class EventLog:
    """Every Celery event published on the broker, heard by a real EventReceiver."""

    def __init__(self, app: Celery) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._connection = app.connection_for_read()
        self._receiver = app.events.Receiver(self._connection, handlers={"*": self._on_event})
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._receiver.capture(limit=None, timeout=None, wakeup=False)
        except Exception:  # the connection closed under it at stop()
            pass

    def _on_event(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, call_id: str) -> list[str]:
        with self._lock:
            return [e["type"] for e in self.events if e.get("uuid") == call_id]

    def heard(self, event_type: str, after_s: float = 0.0) -> bool:
        with self._lock:
            return any(
                e["type"] == event_type and float(e.get("timestamp") or 0) > after_s
                for e in self.events
            )

    def settle(self) -> None:
        """Wait for a worker heartbeat sent a little after now: the worker's event stream
        has moved past everything it did before (an event of a call would be heard by then).
        """
        after_s = time.time() + 0.2
        until(lambda: self.heard("worker-heartbeat", after_s), timeout_s=10, what="a heartbeat")

    def stop(self) -> None:
        self._receiver.should_stop = True
        self._thread.join(timeout=5)
        self._connection.close()


@pytest.fixture()
def watched(
    broker: PrivateRedis, workers: list[WorkerProcess]
) -> Iterator[tuple[Settings, WorkerProcess, EventLog]]:
    env = {"TOOLFLEET_MONITOR_LEASE_S": str(LEASE_S)}
    worker = start_worker("sync", redis_url=broker.url, concurrency=1, env=env)
    workers.append(worker)
    settings = Settings(broker_url=broker.url, tools=("tests.support.sample_tools",))
    app = create_app(settings)
    log = EventLog(app)
    # The receiver is listening once it hears the worker's own heartbeat (every 2 s).
    until(lambda: log.heard("worker-heartbeat"), timeout_s=15, what="a worker heartbeat")
    yield settings, worker, log
    log.stop()
    app.close()


def _one_call(settings: Settings, value: int) -> str:
    async def scenario(fleet: Any) -> str:
        [result] = await Branch(fleet=fleet).act([call("echo", value=value)])
        assert result.status is EventStatus.COMPLETED and result.output == value
        assert result.call_id is not None
        return result.call_id

    return run(settings, scenario, timeout_s=30)


def _leases(broker: PrivateRedis, settings: Settings) -> dict[str, float]:
    client = broker.client()
    try:
        return live_leases(client, settings.key("monitor"))
    finally:
        client.close()


def _flower_task(flower: Any, call_id: str) -> dict[str, Any] | None:
    status, body = http_get(f"{flower.base_url}/api/task/info/{call_id}")
    return json.loads(body) if status == 200 else None


def test_events_only_while_a_monitor_watches(
    watched: tuple[Settings, WorkerProcess, EventLog], broker: PrivateRedis, tmp_path: Path
) -> None:
    settings, worker, log = watched

    # Nobody watches: the call runs, and not one task event is published for it.
    before = _one_call(settings, 1)
    assert _leases(broker, settings) == {}
    log.settle()
    assert log.of(before) == []

    flower = start_flower(broker.url, tmp_path, env={"FLOWER_UNAUTHENTICATED_API": "true"})
    try:
        # toolfleet flower asks at once (not after Flower's first 5 s timer tick).
        asked = time.monotonic()
        until(
            lambda: worker.hostname in _leases(broker, settings),
            timeout_s=4.0,
            what="the worker to take a monitor lease from toolfleet flower",
        )
        assert time.monotonic() - asked < 4.0
        during = _one_call(settings, 2)
        until(
            lambda: (
                {"task-sent", "task-received", "task-started", "task-succeeded"}
                <= set(log.of(during))
            ),
            timeout_s=10,
            what="the four task events of a watched call",
        )
        task = until(
            lambda: (t := _flower_task(flower, during)) and t.get("state") == "SUCCESS" and t,
            timeout_s=10,
            what="Flower to show the watched call as SUCCESS",
        )
        assert task["name"] == "tool:echo" and task["uuid"] == during
        # A call that ran before the monitor attached is not in Flower: it sent no events.
        assert _flower_task(flower, before) is None
    finally:
        stop_flower(flower)

    # The monitor left: within the lease (plus one check), the worker turns events off.
    until(
        lambda: worker.hostname not in _leases(broker, settings),
        timeout_s=LEASE_S + 5,
        what="the monitor lease to lapse after Flower stopped",
    )
    after = _one_call(settings, 3)
    log.settle()
    assert log.of(after) == []
    assert "task events off" in worker.log()


def test_always_keeps_events_on_without_a_monitor(
    broker: PrivateRedis, workers: list[WorkerProcess]
) -> None:
    env = {"TOOLFLEET_TASK_EVENTS": "always"}
    workers.append(start_worker("sync", redis_url=broker.url, concurrency=1, env=env))
    settings = Settings(
        broker_url=broker.url, tools=("tests.support.sample_tools",), task_events="always"
    )
    app = create_app(settings)
    log = EventLog(app)
    try:
        until(lambda: log.heard("worker-heartbeat"), timeout_s=15, what="a worker heartbeat")
        call_id = _one_call(settings, 4)
        until(
            lambda: {"task-sent", "task-received", "task-succeeded"} <= set(log.of(call_id)),
            timeout_s=10,
            what="task events with TOOLFLEET_TASK_EVENTS=always and no monitor",
        )
    finally:
        log.stop()
        app.close()


def test_a_lease_is_read_only_while_live(broker: PrivateRedis) -> None:
    client: redis.Redis = broker.client()
    settings = Settings(broker_url=broker.url)
    key = monitor_key(create_app(settings))
    now = time.time()
    client.hset(key, mapping={"a@h": repr(now + 5), "b@h": repr(now - 1), "c@h": "garbage"})
    assert live_leases(client, key, now_s=now) == {"a@h": pytest.approx(now + 5)}
    client.close()
