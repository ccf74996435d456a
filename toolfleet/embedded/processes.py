"""The embedded fleet's child processes: started in their own process group, killed with it.

Each child (redis-server, a worker) gets its own process group, so stopping its leader's group
reaches the prefork pool it forks; and it dies with toolfleet, even when toolfleet is
SIGKILLed: Linux's parent-death signal for the child itself, and a tiny reaper process
(``reaper.py``) for the groups.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

__all__ = [
    "free_port",
    "log_tail",
    "raise_system_exit",
    "reap_with_this_process",
    "release_group",
    "signals_ignored",
    "spawn",
    "stop_group",
]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: its own process group (so killpg by its PID
    # reaches the prefork pool it forks, and a terminal's Ctrl-C reaches only toolfleet), and
    # death with toolfleet even if toolfleet is SIGKILLed and cannot clean up.
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Reaper:
    """A tiny process that SIGKILLs our children's process groups when this process ends
    without stopping them (see reaper.py); PDEATHSIG alone misses the prefork pool."""

    def __init__(self) -> None:
        script = Path(__file__).with_name("reaper.py")
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # At a normal exit, end it the way a dead toolfleet would (end of file: it kills what
        # is still listed, by then nothing) and reap it, rather than leave a running child
        # for the interpreter to warn about.
        atexit.register(self.close)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=2)

    def send(self, line: str) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return
        with contextlib.suppress(OSError, ValueError):
            stdin.write(line.encode() + b"\n")
            stdin.flush()


_reaper: _Reaper | None = None


def _reaper_send(line: str) -> None:
    global _reaper
    if _reaper is None:
        try:
            _reaper = _Reaper()
        except OSError:
            return  # PDEATHSIG still covers the direct children
    _reaper.send(line)


def reap_with_this_process(pgid: int) -> None:
    """Have the reaper SIGKILL process group ``pgid`` if this process ends, however it ends
    (SIGKILL included), before :func:`release_group` says the group was stopped. For a child
    started in a session of its own (``start_new_session=True``), from any thread."""
    _reaper_send(f"+{pgid}")


def release_group(pgid: int) -> None:
    """The group ``pgid`` was stopped: the reaper forgets it (its id may be reused)."""
    _reaper_send(f"-{pgid}")


def spawn(argv: Sequence[str], *, log: IO[bytes], env: dict[str, str]) -> subprocess.Popen[bytes]:
    preexec = _die_with_parent if sys.platform.startswith("linux") else os.setsid
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=preexec,
    )
    reap_with_this_process(proc.pid)
    return proc


def stop_group(proc: subprocess.Popen[bytes], *, grace_s: float) -> None:
    """SIGTERM the child's process group, then SIGKILL it after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # The leader may be gone while its pool children still run: kill the group regardless.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    release_group(proc.pid)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, signal.SIG_IGN)
    except ValueError:  # not the main thread, where Python runs signal handlers
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def raise_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
