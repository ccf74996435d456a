"""Helpers for the reliability and chaos tests: kill a process by PID.

Not a test module. The private redis-server those tests break is tests/support/redis_server.py;
waiting for a condition is tests/support/waiting.py.
"""

from __future__ import annotations

import contextlib
import os
import signal

__all__ = ["kill_pid"]


def kill_pid(pid: int) -> None:
    """SIGKILL one process by PID; a process already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
