"""``toolfleet broker``: the quick start's Redis in one command. It prints the URL to export,
keeps its data across its restarts (an fsynced append-only file, so ``toolfleet status`` has
no persistence warning for it), stops on Ctrl-C or SIGTERM leaving nothing running, and a
busy port is one line."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import redis

from tests.support.cli_support import (
    REPO_ROOT,
    as_at_a_terminal,
    cli_env,
    killed_on_exit,
    redis_pids_for,
    toolfleet,
    toolfleet_argv,
)
from tests.support.waiting import until
from toolfleet.embedded.processes import free_port


def _broker(home: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        toolfleet_argv("broker", "--port", str(port)),
        cwd=REPO_ROOT,
        env=cli_env(home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_at_a_terminal,
    )


def _stop(proc: subprocess.Popen[str], how: signal.Signals, url: str) -> str:
    proc.send_signal(how)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    until(lambda: not redis_pids_for(url), timeout_s=10, what="redis-server gone")
    return stderr


def test_a_broker_in_one_command_keeps_its_data_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    with killed_on_exit(_broker(tmp_path, port)) as proc:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url == f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.set("toolfleet:test:kept", "1")
        client.close()
        status = toolfleet("status", "--json", "--timeout", "0.3", home=tmp_path,
                           env={"TOOLFLEET_BROKER_URL": url})  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["warnings"] == []  # nothing to set on this one
        stderr = _stop(proc, signal.SIGINT, url)
    assert f"export TOOLFLEET_BROKER_URL={url}" in stderr

    with killed_on_exit(_broker(tmp_path, port)) as again:
        assert again.stdout is not None
        assert again.stdout.readline().strip() == url
        client = redis.Redis.from_url(url)
        assert client.get("toolfleet:test:kept") == b"1"
        client.close()
        _stop(again, signal.SIGTERM, url)


def test_a_busy_port_is_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = toolfleet("broker", "--port", str(port), home=tmp_path, timeout_s=30)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"--port {port}" in line and "in use" in line
