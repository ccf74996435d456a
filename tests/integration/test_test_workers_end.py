"""The test suite's workers end with the process that started them, however it ends: a test
run interrupted by Ctrl-C or SIGKILLed leaves no ``toolfleet worker`` (nor its prefork pool),
nor a Flower, running (tests/support/fleet.py and flower.py hand each one's process group to
the embedded fleet's reaper, toolfleet/embedded/reaper.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.chaos_support import group_pids
from tests.support.cli_support import REPO_ROOT, cli_env, killed_on_exit
from tests.support.waiting import until

# Starts a sync worker (a prefork pool of 2) and a Flower through the test helpers, prints
# their PIDs, then waits to be stopped, never calling stop().
_STARTER = """
import pathlib, sys, time
from tests.support.fleet import start_worker
from tests.support.flower import start_flower
worker = start_worker("sync", redis_url=sys.argv[1], concurrency=2)
flower = start_flower(sys.argv[1], pathlib.Path(sys.argv[2]))
print(worker.pid, flower.proc.pid, flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "sigint"])
def test_a_worker_ends_with_the_test_process_that_started_it(
    how: signal.Signals, redis_url: str, tmp_path: Path
) -> None:
    with killed_on_exit(
        subprocess.Popen(
            [sys.executable, "-c", _STARTER, redis_url, str(tmp_path / "flower")],
            cwd=REPO_ROOT,
            env=cli_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    ) as starter:
        assert starter.stdout is not None
        worker_pid, flower_pid = map(int, starter.stdout.readline().split())
        try:
            until(
                lambda: len(group_pids(worker_pid, live_only=True)) >= 3,
                timeout_s=30,
                what="the pool started",
            )
            starter.send_signal(how)
            starter.wait(timeout=30)
            until(
                lambda: not group_pids(worker_pid, flower_pid, live_only=True),
                timeout_s=10,
                what=lambda: (
                    f"all gone; left: {group_pids(worker_pid, flower_pid, live_only=True)}"
                ),
            )
        finally:
            for pid in group_pids(
                worker_pid, flower_pid, live_only=True
            ):  # nothing left if it fails
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
