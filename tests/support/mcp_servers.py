"""``toolfleet mcp --transport http`` processes for the MCP tests: started on a free port,
waited for, stopped (or SIGKILLed by the test) afterwards."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.fleet import REPO_ROOT
from tests.support.waiting import until
from toolfleet.embedded.processes import free_port

__all__ = ["cli_command", "http_replica", "server_env"]


def server_env(fleet_env: dict[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFLEET_", "OTEL_"))}
    env.update(fleet_env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def cli_command() -> list[str]:
    """How to run ``toolfleet`` from this interpreter's environment."""
    script = Path(sys.executable).parent / "toolfleet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "toolfleet.cli"]


@contextmanager
def http_replica(
    fleet_env: dict[str, str], tools: Sequence[str], log: Path, *extra: str, **env: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """One HTTP server of the fleet: (its /mcp url, its process)."""
    port = free_port()
    argv = [*cli_command(), "mcp", *[a for m in tools for a in ("--tools", m)]]
    argv += ["--transport", "http", "--port", str(port), *extra]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv, env=server_env(fleet_env, **env), stdout=sink, stderr=subprocess.STDOUT
        )
    try:

        def listening() -> bool:
            assert process.poll() is None, log.read_text()
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        until(listening, timeout_s=60, what=lambda: log.read_text())
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
