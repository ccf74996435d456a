"""Helpers for the CLI tests: run ``toolfleet`` in a subprocess with a fresh HOME, and find the
processes a run left behind by scanning /proc for that HOME in their environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.fleet import wait_for

__all__ = [
    "REPO_ROOT",
    "batch_text",
    "cli_env",
    "no_processes_left",
    "processes_with_home",
    "read_jsonl",
    "redis_pids_for",
    "toolfleet",
    "toolfleet_argv",
    "wait_until",
]

REPO_ROOT = Path(__file__).resolve().parent.parent


def toolfleet_argv(*args: str) -> list[str]:
    """The installed console script (as a user runs it), else ``python -m dispatcher.cli``."""
    script = Path(sys.executable).parent / "toolfleet"
    base = [str(script)] if script.exists() else [sys.executable, "-m", "dispatcher.cli"]
    return [*base, *args]


def cli_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a user on a fresh machine: no TOOLFLEET_* settings, an empty HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env.pop("COLUMNS", None)
    env.update(extra or {})
    return env


def toolfleet(
    *args: str,
    home: Path,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``toolfleet ARGS`` to completion from the repository root."""
    return subprocess.run(
        toolfleet_argv(*args),
        cwd=REPO_ROOT,
        env=cli_env(home, env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def processes_with_home(home: Path) -> list[int]:
    """PIDs of live processes whose environment has ``HOME=<home>`` (this process excluded)."""
    marker = f"HOME={home}".encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def redis_pids_for(broker_url: str) -> list[int]:
    """PIDs of the redis-server behind an embedded ``broker_url``. Redis rewrites its process
    title over its environment, so it is found by that title (its socket or port), not HOME."""
    if broker_url.startswith("redis+socket://"):
        title = ("unixsocket:" + broker_url[len("redis+socket://") :]).encode()
    else:
        title = f"127.0.0.1:{urlsplit(broker_url).port}".encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"redis-server" in cmdline and title in cmdline:
            found.append(int(entry.name))
    return found


def no_processes_left(home: Path, *, timeout_s: float = 10.0) -> None:
    """Wait until nothing started under ``home`` runs (toolfleet's reaper exits just after
    toolfleet does); fail listing the survivors."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = processes_with_home(home)
        if not alive:
            return
        if time.monotonic() > deadline:
            commands = []
            for pid in alive:
                try:
                    commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "))
                except OSError:
                    continue
            raise AssertionError(f"processes left behind: {commands}")
        time.sleep(0.05)


wait_until = wait_for  # one deadline-bounded poll for every test helper


def read_jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def batch_text(lines: Sequence[str]) -> str:
    return "\n".join(lines) + "\n"
