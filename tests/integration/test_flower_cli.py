"""``toolfleet flower`` as a real process against the test Redis: binding, auth, state file."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery.events.state import State

from tests.support.flower import FlowerProcess, http_get, start_flower, stop_flower
from toolfleet.cli import EXIT_USAGE
from toolfleet.cli import flower as flower_cli
from toolfleet.cli.flower import STATE_FILE_NAME, flower_argv
from toolfleet.embedded.processes import free_port
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import masked_url


@pytest.fixture()
def flower_factory(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., FlowerProcess]]:
    started: list[FlowerProcess] = []

    def factory(*args: str, env: dict[str, str] | None = None) -> FlowerProcess:
        flower = start_flower(redis_url, tmp_path / "run", *args, env=env)
        started.append(flower)
        return flower

    yield factory
    for flower in started:
        stop_flower(flower)


def test_basic_auth_refuses_without_credentials_and_accepts_with_them(
    flower_factory: Callable[..., FlowerProcess],
) -> None:
    flower = flower_factory(
        "--basic-auth", "ops:s3cret-pw", "--basic-auth", "viewer:other-pw", "--no-persistent"
    )

    for path in ("/api/tasks", "/api/workers", "/tasks", "/"):
        status, _ = http_get(flower.base_url + path)
        assert status == 401, f"{path} answered {status} without credentials"
        status, _ = http_get(flower.base_url + path, auth=("ops", "wrong"))
        assert status == 401, f"{path} answered {status} with a wrong password"

    status, body = http_get(flower.base_url + "/api/tasks", auth=("ops", "s3cret-pw"))
    assert status == 200
    assert body.strip() == b"{}"
    status, _ = http_get(flower.base_url + "/tasks", auth=("ops", "s3cret-pw"))
    assert status == 200
    # Every user given is accepted, not only the last one.
    status, _ = http_get(flower.base_url + "/api/tasks", auth=("viewer", "other-pw"))
    assert status == 200
    # Prometheus scrapes without credentials.
    status, body = http_get(flower.base_url + "/metrics")
    assert status == 200
    assert b"flower_events_total" in body or b"# HELP" in body


def test_binds_loopback_by_default_and_keeps_state_in_the_run_dir(
    flower_factory: Callable[..., FlowerProcess], tmp_path: Path
) -> None:
    flower = flower_factory(env={"FLOWER_UNAUTHENTICATED_API": "true"})

    status, _ = http_get(flower.base_url + "/api/tasks")
    assert status == 200
    # Bound to 127.0.0.1 only: another local address of this machine is refused.
    other = _non_loopback_address()
    if other is not None:
        with pytest.raises(OSError), socket.create_connection((other, flower.port), timeout=2):
            pass

    stop_flower(flower)
    assert flower.proc.returncode == 0, flower.log()
    state_files = list((tmp_path / "run").glob(STATE_FILE_NAME + "*"))
    assert state_files, f"no {STATE_FILE_NAME} in the run dir after shutdown:\n{flower.log()}"


def test_without_a_broker_exits_2_naming_the_variable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    # A private run dir, so an embedded fleet another test runs now is not found.
    env["TOOLFLEET_RUN_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "toolfleet.cli", "flower", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "TOOLFLEET_BROKER_URL" in result.stderr


def test_without_a_broker_url_monitors_the_running_embedded_fleet(
    redis_url: str, tmp_path: Path
) -> None:
    # An embedded fleet advertises its private Redis in <run dir>/run/<pid>/broker_url while
    # its process lives; this test process stands in for that `toolfleet run`.
    fleet_dir = tmp_path / "run" / str(os.getpid())
    fleet_dir.mkdir(parents=True)
    (fleet_dir / "broker_url").write_text(redis_url)
    flower = start_flower("", tmp_path, "--no-persistent")
    try:
        assert f"monitoring the embedded fleet of pid {os.getpid()} at {redis_url}" in flower.log()
        status, _ = http_get(flower.base_url + "/metrics")
        assert status == 200
    finally:
        stop_flower(flower)


def test_the_embedded_redis_password_is_not_printed() -> None:
    masked = masked_url("redis://:s3cret@127.0.0.1:6380/0")
    assert masked == "redis://:***@127.0.0.1:6380/0"


def test_flower_argv_rejects_malformed_basic_auth_without_echoing_it() -> None:
    with pytest.raises(ConfigurationError, match="USER:PASSWORD") as no_colon:
        flower_argv(
            port=5555,
            address="127.0.0.1",
            basic_auth=["just-a-password"],
            persistent=False,
            db_path=Path("x"),
        )
    assert "just-a-password" not in str(no_colon.value)
    with pytest.raises(ConfigurationError, match=r"'ops'.*comma") as comma:
        flower_argv(
            port=5555,
            address="127.0.0.1",
            basic_auth=["ops:pass,word"],
            persistent=False,
            db_path=Path("x"),
        )
    assert "pass,word" not in str(comma.value)
    with pytest.raises(ConfigurationError, match="USER:PASSWORD"):
        flower_argv(
            port=5555,
            address="127.0.0.1",
            basic_auth=["nocolon"],
            persistent=False,
            db_path=Path("x"),
        )
    with pytest.raises(ConfigurationError, match="70000"):
        flower_argv(
            port=70000,
            address="127.0.0.1",
            basic_auth=None,
            persistent=False,
            db_path=Path("x"),
        )


def _non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("10.255.255.255", 1))
            address: str = sock.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def _task_event(type_: str, name: str, **fields: object) -> dict[str, object]:
    return {
        "type": type_,
        "uuid": "call-1",
        "name": name,
        "hostname": "sync-1@host",
        "timestamp": time.time(),
        "local_received": time.time(),
        "clock": 1,
        **fields,
    }


_ARGSREPR = "({'call_id': 'call-1', 'branch_id': 'b-1', 'function': 'add', 'arguments': {}},)"


def test_a_late_task_sent_event_does_not_rename_the_call() -> None:
    # The worker's task-received (shadow name) can overtake the dispatcher's task-sent
    # (real task name): the call must keep its tool name either way.
    for sent_name in ("toolfleet.execute", "some.other.name"):
        state = State()
        flower_cli.track_calls(state)
        state.event(_task_event("task-received", "tool:add", args=_ARGSREPR))
        state.event(_task_event("task-sent", sent_name, args=_ARGSREPR))
        task = state.tasks["call-1"]
        assert task.name == "tool:add"
        assert task.state == "RECEIVED"
        assert task.sent is not None


def test_a_queued_call_is_named_for_its_tool() -> None:
    state = State()
    flower_cli.track_calls(state)
    state.event(_task_event("task-sent", "toolfleet.execute", args=_ARGSREPR))
    assert state.tasks["call-1"].name == "tool:add"
    assert state.tasks["call-1"].state == "PENDING"
    # Unknown argument shapes are left alone rather than guessed.
    other = State()
    flower_cli.track_calls(other)
    other.event(_task_event("task-sent", "toolfleet.execute", args="('opaque',)"))
    assert other.tasks["call-1"].name == "toolfleet.execute"


def test_a_failed_call_gets_its_started_to_failed_runtime() -> None:
    state = State()
    flower_cli.track_calls(state)
    state.event(_task_event("task-received", "tool:fail", args=_ARGSREPR, timestamp=100.0))
    state.event(_task_event("task-started", "", timestamp=100.5))
    state.event(_task_event("task-failed", "", exception="ValueError('x')", timestamp=102.0))
    task = state.tasks["call-1"]
    assert task.state == "FAILURE"
    assert task.runtime == pytest.approx(1.5)
