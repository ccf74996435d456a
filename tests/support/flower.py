"""``toolfleet flower`` as a real process for tests: start it on a free port, ask its HTTP API,
wait until it watches the workers, stop it."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import WorkerProcess
from tests.support.waiting import until
from toolfleet.broker.redis_url import sync_client
from toolfleet.embedded.processes import free_port, reap_with_this_process, release_group
from toolfleet.schemas.settings import Settings
from toolfleet.workers.app_info import redis_url_from
from toolfleet.workers.monitor import live_leases

__all__ = [
    "FLOWER_EVENTS_TIMEOUT_S",
    "FlowerProcess",
    "api",
    "flower_fixture",
    "http_get",
    "parse_metrics",
    "start_flower",
    "stop_flower",
    "wait_until_flower_watches",
]

_START_DEADLINE_S = 30.0
FLOWER_EVENTS_TIMEOUT_S = 30.0


@dataclass
class FlowerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def http_get(
    url: str, auth: tuple[str, str] | None = None, timeout_s: float = 5.0
) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def start_flower(
    broker_url: str, run_dir: Path, *args: str, env: dict[str, str] | None = None
) -> FlowerProcess:
    """Start ``toolfleet flower`` on a free port; return once /healthcheck answers."""
    port = free_port()
    log_path = run_dir / f"flower-{port}.log"
    run_dir.mkdir(parents=True, exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWER_", "TOOLFLEET_"))}
    full_env["TOOLFLEET_RUN_DIR"] = str(run_dir)
    if broker_url:
        full_env["TOOLFLEET_BROKER_URL"] = broker_url
    full_env.update(env or {})
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolfleet.cli", "flower", "--port", str(port), *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,  # a group of its own, for the reaper below
        )
    # Flower ends with this process however it ends (Ctrl-C, SIGKILL): the embedded fleet's
    # reaper kills its group if stop_flower() never ran.
    reap_with_this_process(proc.pid)
    flower = FlowerProcess(proc, port, log_path)

    def healthy() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"toolfleet flower exited with {proc.returncode}:\n{flower.log()}")
        try:
            status, _ = http_get(f"{flower.base_url}/healthcheck", timeout_s=1.0)
        except OSError:
            return False
        return status == 200

    try:
        until(
            healthy,
            timeout_s=_START_DEADLINE_S,
            interval_s=0.1,
            what=lambda: f"toolfleet flower to answer:\n{flower.log()}",
        )
    except TimeoutError as exc:
        stop_flower(flower)
        pytest.fail(str(exc))
    return flower


def stop_flower(flower: FlowerProcess) -> None:
    if flower.proc.poll() is None:
        os.kill(flower.proc.pid, signal.SIGTERM)
        try:
            flower.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(flower.proc.pid, signal.SIGKILL)
            flower.proc.wait(timeout=5)
    release_group(flower.proc.pid)


def flower_fixture() -> Any:
    """A module-scoped ``flower`` fixture: ``toolfleet flower`` watching the session's Redis
    (whose workers store Celery results there too, as ``fleet_settings`` says)."""

    def flower(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowerProcess]:
        run_dir = tmp_path_factory.mktemp("flower-run")
        env = {"FLOWER_UNAUTHENTICATED_API": "true", "TOOLFLEET_RESULT_BACKEND": redis_url}
        process = start_flower(redis_url, run_dir, env=env)
        yield process
        stop_flower(process)

    return pytest.fixture(scope="module", name="flower")(flower)


def wait_until_flower_watches(
    flower: FlowerProcess,
    fleet_settings: Settings,
    workers: list[WorkerProcess],
    timeout_s: float = FLOWER_EVENTS_TIMEOUT_S,
) -> None:
    """Wait until Flower has heard each of ``workers`` and each sends task events."""
    # Flower only sees events sent while it listens: wait until it has heard every worker.
    for worker in workers:
        until(
            lambda w=worker: _worker_online(flower, w.hostname),  # type: ignore[misc]
            timeout_s=timeout_s,
            interval_s=0.2,
            what=f"Flower to receive heartbeats from {worker.hostname}",
        )
    # Task events are off until a monitor asks: toolfleet flower asks as it starts, and each
    # worker records its lease; only then are the calls' events sure to be sent.
    client = sync_client(redis_url_from(fleet_settings.broker_url, fleet_settings.sentinel_master))
    try:
        until(
            lambda: (
                {w.hostname for w in workers}
                <= set(live_leases(client, fleet_settings.key("monitor")))
            ),
            timeout_s=timeout_s,
            interval_s=0.1,
            what=f"{[w.hostname for w in workers]} to take the monitor lease Flower asked for",
        )
    finally:
        client.close()


def _worker_online(flower: FlowerProcess, hostname: str) -> bool:
    status, body = http_get(flower.base_url + "/metrics", timeout_s=2.0)
    if status != 200:
        return False
    key = ("flower_worker_online", (("worker", hostname),))
    return parse_metrics(body.decode()).get(key) == 1.0


def api(flower: FlowerProcess, path: str) -> Any:
    """Flower's JSON answer at ``path``; None for a 404."""
    status, body = http_get(flower.base_url + path)
    if status == 404:
        return None
    assert status == 200, f"{path}: {status} {body[:200]!r}"
    return json.loads(body)


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text format → {(metric, sorted labels): value}."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        labels = tuple(sorted(_LABEL.findall(match["labels"] or "")))
        samples[(match["name"], labels)] = float(match["value"])
    return samples
