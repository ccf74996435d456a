"""``toolfleet demo`` then ``toolfleet history`` on a fresh HOME with nothing configured: the
README's main job, end to end in subprocesses."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_support import (
    REPO_ROOT,
    as_at_a_terminal,
    cli_env,
    killed_on_exit,
    no_processes_left,
    toolfleet,
    toolfleet_argv,
)
from tests.support.waiting import until

pytestmark = pytest.mark.slow  # real processes: embedded Redis and workers


def test_demo_then_history_on_a_fresh_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    demo = toolfleet("demo", "--async-calls", "20", "--sync-calls", "2", home=home)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    assert "What happened" in out and "Where to look next" in out
    assert "2 blocking sync calls" in out and "worker process(es)" in out
    assert "20 async calls" in out and "asyncio pool" in out
    assert "ValueError: cannot parse 'forty-two' as a number" in out
    assert "denied by governance gate" in out
    assert "[red]" not in out and "did not" not in out  # no failed expectation
    match = re.search(r"toolfleet history ([0-9a-f-]{36})", out)
    assert match, out
    branch_id = match.group(1)
    no_processes_left(home)

    # The branch's history outlives the embedded fleet: it was saved with the Redis data.
    history = toolfleet("history", branch_id, "--json", home=home)
    assert history.returncode == 0, history.stderr
    stored = json.loads(history.stdout)
    messages = stored["messages"]
    assert len(messages) == 2 * 24  # 2 sync + 20 async + the failure + the denial
    functions = [m["content"]["function"] for m in messages[::2]]
    assert functions == ["checksum_file"] * 2 + ["fetch_page"] * 20 + [
        "parse_number",
        "delete_files",
    ]
    failure, denial = messages[-3], messages[-1]
    assert failure["content"]["error"] == "ValueError: cannot parse 'forty-two' as a number"
    assert denial["content"]["output"] == {
        "error": "denied by governance gate",
        "function": "delete_files",
    }
    # Every call that ran has its event record; the denied one never ran.
    assert len(stored["events"]) == 23

    table = toolfleet("history", branch_id, home=home)
    assert table.returncode == 0, table.stderr
    assert "48 messages" in table.stdout and "delete_files" in table.stdout
    assert "error: ValueError" in table.stdout
    no_processes_left(home)


def test_ctrl_c_during_the_demo_stops_it_and_keeps_its_history(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # 40 blocking calls of 0.4 s on two processes: about 8 s of work to interrupt.
    with killed_on_exit(
        subprocess.Popen(
            toolfleet_argv("demo", "--sync-calls", "40", "--async-calls", "2"),
            preexec_fn=as_at_a_terminal,
            cwd=REPO_ROOT,
            env=cli_env(home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    ) as proc:
        seen: list[dict[str, Any]] = []

        def running() -> bool:
            status = toolfleet("status", "--json", home=home)
            seen[:] = [json.loads(status.stdout)] if status.returncode == 0 else []
            return bool(seen) and seen[0]["in_flight"] > 0

        until(running, timeout_s=90, interval_s=0.2, what="the demo's calls running")
        # The embedded Redis is toolfleet's own, saved when it stops: no advice to act on.
        assert seen[0]["warnings"] == []
        table = toolfleet("status", home=home)
        assert table.returncode == 0 and "appendonly" not in table.stdout + table.stderr
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    match = re.search(r"toolfleet history ([0-9a-f-]{36})", stderr)
    assert match, stderr
    no_processes_left(home)
    history = toolfleet("history", match.group(1), "--json", home=home)
    assert history.returncode == 0, history.stderr
    statuses = {e["execution"]["status"] for e in json.loads(history.stdout)["events"]}
    assert "cancelled" in statuses, statuses
