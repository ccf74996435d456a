"""The compose stack without Docker: each service's own command and environment, run here.

``worker-sync``, ``worker-async`` and ``flower`` are started exactly as docker-compose.yml
says (only the broker, queue names and Flower's port/address are pointed at this test), then
the ``demo`` service's command runs its batch (the file the Dockerfile copies into the image)
against them, and Flower, with the compose file's basic auth, shows the calls.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.test_deploy_compose import COMPOSE_FILE, DOCKERFILE, ENV, interpolate
from tests.support.fleet import REPO_ROOT, WorkerProcess
from tests.support.flower import FlowerProcess, http_get, start_flower, stop_flower
from tests.support.waiting import until
from toolfleet.workers.monitor import live_leases

_RUN_TIMEOUT_S = 120.0


def image_paths() -> dict[str, Path]:
    """Container path → repository file, from the Dockerfile's COPY lines."""
    paths: dict[str, Path] = {}
    for source, target in re.findall(
        r"^COPY\s+(?!--from)(\S+)\s+(/\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE
    ):
        paths[target] = REPO_ROOT / source
    return paths


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    import yaml

    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    services: dict[str, dict[str, Any]] = interpolate(loaded, ENV)["services"]
    return services


@pytest.fixture(scope="module")
def stack_env(redis_url: str) -> dict[str, str]:
    # Own queues and key prefix: the session's shared workers must not take these calls.
    tag = f"compose-{uuid.uuid4().hex[:8]}"
    return {
        "TOOLFLEET_BROKER_URL": redis_url,
        "TOOLFLEET_KEY_PREFIX": tag,
        "TOOLFLEET_SYNC_QUEUE": f"{tag}.sync",
        "TOOLFLEET_ASYNC_QUEUE": f"{tag}.async",
    }


def service_env(spec: dict[str, Any], stack_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFLEET_", "FLOWER_"))}
    env.update({k: str(v) for k, v in spec.get("environment", {}).items()})
    env.update(stack_env)
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def toolfleet_argv(command: list[str]) -> list[str]:
    assert command[0] == "toolfleet"
    return [sys.executable, "-m", "toolfleet.cli", *command[1:]]


@pytest.fixture(scope="module")
def workers(
    services: dict[str, dict[str, Any]], stack_env: dict[str, str]
) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    try:
        for name in ("worker-sync", "worker-async"):
            spec = services[name]
            log_fd, log_name = tempfile.mkstemp(prefix=f"toolfleet-{name}-", suffix=".log")
            try:
                process = subprocess.Popen(
                    toolfleet_argv([str(part) for part in spec["command"]]),
                    env=service_env(spec, stack_env),
                    stdout=log_fd,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # stop() kills the group, prefork children too
                )
            finally:
                os.close(log_fd)
            started.append(WorkerProcess(name, name, process, Path(log_name)))
        yield started
    finally:
        for worker in started:
            worker.stop(timeout_s=10)


@pytest.fixture(scope="module")
def flower(
    services: dict[str, dict[str, Any]],
    stack_env: dict[str, str],
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[FlowerProcess]:
    spec = services["flower"]
    args = [str(part) for part in spec["command"][2:]]
    # Same options, but loopback and a free port: this machine is shared.
    args[args.index("--address") + 1] = "127.0.0.1"
    port_at = args.index("--port")
    del args[port_at : port_at + 2]  # start_flower picks a free one
    env = {k: v for k, v in service_env(spec, stack_env).items() if k.startswith("FLOWER_")}
    env.update({k: v for k, v in stack_env.items() if k != "TOOLFLEET_BROKER_URL"})
    process = start_flower(redis_url, tmp_path_factory.mktemp("stack-flower"), *args, env=env)
    yield process
    stop_flower(process)


def test_demo_service_runs_its_batch_on_the_compose_workers(
    services: dict[str, dict[str, Any]],
    stack_env: dict[str, str],
    workers: list[WorkerProcess],
    flower: FlowerProcess,
    redis_url: str,
    tmp_path: Path,
) -> None:
    spec = services["demo"]
    command = [str(part) for part in spec["command"]]
    in_image = image_paths()
    batch_arg = next(part for part in command if part.startswith("/"))
    assert batch_arg in in_image, f"{batch_arg} is not copied into the image by the Dockerfile"
    batch_file = in_image[batch_arg]
    batch = [json.loads(line) for line in batch_file.read_text().splitlines() if line.strip()]

    for worker in workers:
        until(
            lambda w=worker: _online_in_flower(flower, w.pid),  # type: ignore[misc]
            timeout_s=60,
            interval_s=0.25,
            what=f"Flower to hear {worker.kind} (pid {worker.pid}) online",
        )
    # Task events flow only once a worker holds Flower's enable_events lease
    # (docs/task-events.md); calls that ran before it would never appear in Flower.
    monitor = redis.Redis.from_url(redis_url)
    try:
        for worker in workers:
            until(
                lambda w=worker: any(  # type: ignore[misc]
                    host.endswith(f".{w.pid}")
                    for host in live_leases(monitor, f"{stack_env['TOOLFLEET_KEY_PREFIX']}:monitor")
                ),
                timeout_s=30,
                interval_s=0.25,
                what=f"{worker.kind} (pid {worker.pid}) to hold Flower's task-event lease",
            )
    finally:
        monitor.close()

    output = tmp_path / "results.jsonl"
    argv = toolfleet_argv([batch_file.as_posix() if p == batch_arg else p for p in command])
    result = subprocess.run(
        [*argv, "--output", str(output)],
        env=service_env(spec, stack_env),
        capture_output=True,
        text=True,
        timeout=_RUN_TIMEOUT_S,
    )
    logs = "\n".join(w.log()[-2000:] for w in workers)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{logs}"

    results = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["function"] for r in results] == [c["function"] for c in batch]
    kinds = {c["function"] for c in batch}
    assert {"checksum_file", "fetch_page"} <= kinds, "the demo should use both worker kinds"

    # Flower, as the compose file configures it, requires its basic auth and shows the calls.
    user, _, password = services["flower"]["environment"]["FLOWER_BASIC_AUTH"].partition(":")
    assert http_get(flower.base_url + "/api/tasks")[0] == 401

    call_ids = {r["call_id"] for r in results}
    assert len(call_ids) == len(batch) and None not in call_ids

    def flower_tasks() -> list[dict[str, Any]] | None:
        status, body = http_get(flower.base_url + "/api/tasks", auth=(user, password))
        assert status == 200
        tasks = [t for cid, t in json.loads(body).items() if cid in call_ids]
        done = [t for t in tasks if t["state"] == "SUCCESS"]
        return tasks if len(done) == len(batch) else None

    tasks = until(flower_tasks, timeout_s=30, interval_s=0.25, what="Flower to see the demo")
    by_name = {t["name"]: t["worker"] for t in tasks}
    assert set(by_name) == {f"tool:{function}" for function in kinds}
    # Blocking tools ran on the sync service, async ones on the async service.
    assert f".{workers[0].pid}" in by_name["tool:checksum_file"]
    assert f".{workers[1].pid}" in by_name["tool:fetch_page"]


def _online_in_flower(flower: FlowerProcess, pid: int) -> bool:
    status, body = http_get(flower.base_url + "/metrics", timeout_s=2.0)
    pattern = rf'^flower_worker_online{{worker="[^"]*\.{pid}"}} 1\.0$'
    return status == 200 and re.search(pattern, body.decode(), flags=re.MULTILINE) is not None
