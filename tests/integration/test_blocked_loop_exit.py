"""A program that fails while an act() waits for approval ends at once, even after it blocked
its own event loop for a moment.

``asyncio.run`` cancels a failed program's leftover tasks once. A pending act() must end on
that one cancel (C9: its parked call withdrawn), whatever the loop turn it lands in: a cancel
lost inside a Redis command left the approval wait polling for its whole approval time
(toolfleet.broker.redis_cancel). The program (tests/support/blocked_loop_exit.py) runs in a
process of its own against real workers, as its author ran it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.cli_support import REPO_ROOT, killed_on_exit
from tests.support.fleet import private_workers
from toolfleet.schemas.keys import Keys

TOOLS = ("tests.support.approval_tools",)
# The program takes about two seconds (start, park, settle, block); seconds more would be
# the hang, which lasted the call's whole approval time (an hour by default).
EXIT_WITHIN_S = 20.0


@pytest.fixture(scope="module")
def fleet_env(redis_url: str) -> Iterator[dict[str, str]]:
    with private_workers(redis_url, "blocked-loop", tools=TOOLS) as env:
        yield {**env, "TOOLFLEET_TOOLS": ",".join(TOOLS)}


def test_a_program_failing_while_a_call_waits_for_approval_exits_with_its_error(
    fleet_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**os.environ, **fleet_env, "PYTHONPATH": str(REPO_ROOT), "SIDE": str(tmp_path / "side")}
    started = time.monotonic()
    with killed_on_exit(
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.blocked_loop_exit"],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    ) as proc:
        try:
            out, err = proc.communicate(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(
                f"the program still ran {EXIT_WITHIN_S:g}s after it started (stdout {out!r}); "
                f"its act() did not end on asyncio.run's cancel:\n{err[-3000:]}"
            )
    took_s = time.monotonic() - started
    assert out.strip() == "parked", (out, err[-3000:])  # it failed while the call waited
    assert proc.returncode == 1, err[-3000:]
    error = "RuntimeError: main() fails while a call waits for approval"
    assert err.rstrip().endswith(error), err[-3000:]
    assert took_s < EXIT_WITHIN_S
    # C9: the cancelled act() withdrew its parked call; nobody is asked to decide it, and
    # the tool never ran.
    keys = Keys(fleet_env["TOOLFLEET_KEY_PREFIX"])
    client = redis.Redis.from_url(fleet_env["TOOLFLEET_BROKER_URL"])
    try:
        assert client.zcard(keys.approvals()) == 0
        [parked] = [client.hgetall(key) for key in client.scan_iter(match=keys.approval("*"))]
    finally:
        client.close()
    assert parked[b"state"] == b"expired" and parked[b"decided_by"] == b"cancel", parked
    assert not (tmp_path / "side").exists()
