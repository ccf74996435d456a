"""``toolfleet flower`` ends when it should and refuses bad settings.

A Flower watching an embedded fleet stops by itself when that fleet's toolfleet ends; any
``toolfleet flower`` exits on SIGTERM and on SIGINT, also while it is retrying a broker that is
gone; a busy port is one line naming ``--port``, exit 2.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.flower import http_get, start_flower, stop_flower
from tests.support.redis_server import PrivateRedis
from toolfleet.cli import EXIT_USAGE
from toolfleet.embedded.processes import free_port

pytestmark = pytest.mark.slow


def test_a_flower_on_an_embedded_fleet_stops_when_the_fleet_stops(
    tmp_path: Path, broker: PrivateRedis
) -> None:
    # A real process stands in for the `toolfleet run` that owns the embedded fleet: it is
    # what advertises <run dir>/run/<pid>/broker_url while it lives.
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        fleet_dir = tmp_path / "run" / str(owner.pid)
        fleet_dir.mkdir(parents=True)
        (fleet_dir / "broker_url").write_text(broker.url)
        flower = start_flower("", tmp_path, "--no-persistent")
        try:
            assert f"embedded fleet of pid {owner.pid}" in flower.log()
            owner.kill()
            owner.wait()
            flower.proc.wait(timeout=30)
            assert flower.proc.returncode == 0, flower.log()
            assert f"the embedded fleet of pid {owner.pid} stopped" in flower.log()
        finally:
            stop_flower(flower)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_flower_exits_on_a_signal_while_its_broker_is_gone(
    signum: signal.Signals, tmp_path: Path, broker: PrivateRedis
) -> None:
    env = {"FLOWER_UNAUTHENTICATED_API": "true"}
    flower = start_flower(broker.url, tmp_path / "run", "--no-persistent", env=env)
    try:
        broker.kill()
        # Ask Flower for something only the broker knows: a thread of Flower's executor is
        # then stuck reconnecting to the dead broker (what used to keep it from exiting).
        try:
            http_get(flower.base_url + "/api/workers?refresh=1", timeout_s=3.0)
        except OSError:
            pass  # it hangs on the broker: the state this test needs
        assert flower.proc.poll() is None, flower.log()
        flower.proc.send_signal(signum)
        flower.proc.wait(timeout=30)
        assert flower.proc.returncode == 0, flower.log()
    finally:
        stop_flower(flower)


def test_a_busy_port_is_one_line_naming_it(tmp_path: Path, redis_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "toolfleet.cli", "flower", "--port", str(port)],
            env=_env(tmp_path, redis_url),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == EXIT_USAGE, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"--port {port}" in last and "pass a free --port" in last, result.stderr
    assert "Traceback" not in result.stderr


def _env(tmp_path: Path, broker_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWER_", "TOOLFLEET_"))}
    env["TOOLFLEET_RUN_DIR"] = str(tmp_path)
    env["TOOLFLEET_BROKER_URL"] = broker_url
    return env


def test_flower_refuses_a_silent_broker_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "toolfleet.cli", "flower", "--port", str(free_port())],
        env=_env(tmp_path, "redis://127.0.0.1:1/0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "does not answer" in result.stderr and "TOOLFLEET_BROKER_URL" in result.stderr
