"""Helpers for the CLI tests: run ``toolfleet`` in a subprocess with a fresh HOME, and find the
processes a run left behind by scanning /proc for that HOME in their environment."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.waiting import until

__all__ = [
    "REPO_ROOT",
    "batch_text",
    "cli_env",
    "killed_on_exit",
    "no_processes_left",
    "processes_with_home",
    "read_jsonl",
    "redis_pids_for",
    "toolfleet",
    "toolfleet_argv",
]

REPO_ROOT = Path(__file__).resolve().parents[2]


def toolfleet_argv(*args: str) -> list[str]:
    """The installed console script (as a user runs it), else ``python -m toolfleet.cli``."""
    script = Path(sys.executable).parent / "toolfleet"
    base = [str(script)] if script.exists() else [sys.executable, "-m", "toolfleet.cli"]
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

    def left_behind() -> str:
        commands = []
        for pid in processes_with_home(home):
            try:
                commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "))
            except OSError:
                continue
        return f"nothing left running under {home}; processes left behind: {commands}"

    until(lambda: not processes_with_home(home), timeout_s=timeout_s, what=left_behind)


def read_jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def batch_text(lines: Sequence[str]) -> str:
    return "\n".join(lines) + "\n"


def _read_pty(master: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """What the child wrote to the terminal until it closed it or exited, or ``timeout_s``
    passed (then the caller's wait for the child fails and kills it)."""
    chunks: list[bytes] = []

    def ended() -> bool:
        ready, _, _ = select.select([master], [], [], 0.1)  # the wait is the select itself
        if not ready:
            return proc.poll() is not None
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            return True
        chunks.append(data)
        return not data

    with contextlib.suppress(TimeoutError):
        until(ended, timeout_s=timeout_s, interval_s=0, what="the terminal to close")
    return b"".join(chunks)


@contextlib.contextmanager
def killed_on_exit(proc: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    """``proc``, killed and reaped on the way out if it still runs: a test that failed
    before its child ended leaves no process behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def as_at_a_terminal() -> None:
    """``preexec_fn`` for a child that a test interrupts with SIGINT, as Ctrl-C at a terminal.

    A shell starts background jobs with SIGINT ignored (no job control), and Python keeps an
    ignored SIGINT ignored: under such a shell (CI, ``nohup``, ``cmd &``) the child would never
    see the test's Ctrl-C. A terminal's foreground process always has the default handler.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def toolfleet_on_terminal(*args: str, env: Mapping[str, str], timeout_s: float) -> tuple[int, str]:
    """Run ``toolfleet *args`` on a pseudo-terminal (so it draws as for a person) in a session
    of its own; its exit status and everything it wrote to the terminal. Killed (the whole
    session) if it has not ended after ``timeout_s`` plus 30 s."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        toolfleet_argv(*args),
        cwd=REPO_ROOT,
        env=dict(env),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    try:
        screen = _read_pty(master, proc, timeout_s=timeout_s).decode(errors="replace")
        returncode = proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return returncode, screen
