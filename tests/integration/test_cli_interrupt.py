"""Ctrl-C during ``toolfleet run`` keeps every finished result.

A real ``toolfleet run`` subprocess gets SIGINT once its ``--output`` holds the results of the
fast calls (a condition, not a sleep); the slow calls are then still running. Every line must
have its result line (finished ones as they were, unfinished ones cancelled) in ``--output``
and on ``--json``'s stdout, the branch id and the history command are printed, exit 130, and
the branch's history is readable. Against an external Redis the message names the batch, not
the fleet, and the user's workers stay up.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_support import (
    REPO_ROOT,
    as_at_a_terminal,
    batch_text,
    cli_env,
    killed_on_exit,
    no_processes_left,
    read_jsonl,
    toolfleet,
    toolfleet_argv,
)
from tests.support.fleet import WorkerProcess
from tests.support.waiting import until

pytestmark = pytest.mark.slow  # real processes: toolfleet, Redis and workers

TOOLS = "tests.support.sample_tools"
FAST = [f'{{"function": "add", "arguments": {{"a": {n}, "b": 1}}}}' for n in range(5)]
MALFORMED = '{"function": "add", "arguments": {"a": 1'


def _lines_in(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def _interrupt_after_fast_calls(
    batch: list[str], tmp_path: Path, home: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """Run ``batch`` with --output and --json; SIGINT once the fast lines are in --output."""
    path = tmp_path / "batch.jsonl"
    path.write_text(batch_text(batch))
    output = tmp_path / "results.jsonl"
    with killed_on_exit(
        subprocess.Popen(
            toolfleet_argv("run", str(path), "--tools", TOOLS, "--json", "--output", str(output)),
            preexec_fn=as_at_a_terminal,
            cwd=REPO_ROOT,
            env=cli_env(home, env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    ) as proc:
        # Results stream to --output as calls finish: the five fast calls and the malformed
        # line are there while the slow calls still run.
        until(
            lambda: _lines_in(output) >= len(FAST) + 1,
            timeout_s=90,
            interval_s=0.1,
            what="the fast calls' results in --output",
        )
        assert proc.poll() is None, "the run ended before the slow calls were interrupted"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    completed = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert proc.returncode == 130, stderr
    written = read_jsonl(output.read_text())
    # --json prints the same lines as --output.
    assert read_jsonl(stdout) == written
    return completed, written


def _check_results(records: list[dict[str, Any]], slow: int) -> str:
    assert [r["line"] for r in records] == list(range(1, len(FAST) + 2 + slow))
    for n, record in enumerate(records[: len(FAST)]):
        assert record["outcome"] == "done" and record["output"] == n + 1
    assert records[len(FAST)]["outcome"] == "malformed"
    for record in records[len(FAST) + 1 :]:
        assert record["outcome"] == "cancelled" and record["status"] == "cancelled", record
    (branch_id,) = {str(r["branch_id"]) for r in records}
    return branch_id


def _check_history(branch_id: str, home: Path, env: dict[str, str] | None, calls: int) -> None:
    history = toolfleet("history", branch_id, "--json", home=home, env=env)
    assert history.returncode == 0, history.stderr
    events = json.loads(history.stdout)["events"]
    statuses = [e["execution"]["status"] for e in events]
    assert statuses[: len(FAST)] == ["completed"] * len(FAST)
    assert statuses[len(FAST) :] == ["cancelled"] * (calls - len(FAST))


def test_ctrl_c_on_the_embedded_default_keeps_finished_results(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    slow = [
        '{"function": "sleep_sync", "arguments": {"seconds": 60}}',
        '{"function": "sleep_async", "arguments": {"seconds": 60}}',
        '{"function": "sleep_async", "arguments": {"seconds": 60}}',
    ]
    proc, records = _interrupt_after_fast_calls([*FAST, MALFORMED, *slow], tmp_path, home)
    branch_id = _check_results(records, len(slow))
    assert f"toolfleet history {branch_id}" in proc.stderr
    assert "5 call(s) finished, 3 cancelled" in proc.stderr
    assert "embedded fleet were stopped" in proc.stderr
    no_processes_left(home)
    # The embedded Redis saved the branch on its way out.
    _check_history(branch_id, home, None, len(FAST) + len(slow))


def test_ctrl_c_against_an_external_redis_stops_the_batch_not_the_fleet(
    tmp_path: Path, redis_url: str, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    env = {"TOOLFLEET_BROKER_URL": redis_url}
    slow = ['{"function": "sleep_async", "arguments": {"seconds": 60}}'] * 2
    proc, records = _interrupt_after_fast_calls([*FAST, MALFORMED, *slow], tmp_path, tmp_path, env)
    branch_id = _check_results(records, len(slow))
    assert f"toolfleet history {branch_id}" in proc.stderr
    assert "the batch was stopped" in proc.stderr
    assert "fleet were stopped" not in proc.stderr and "fleet was stopped" not in proc.stderr
    assert sync_worker.process.poll() is None and async_worker.process.poll() is None
    _check_history(branch_id, tmp_path, env, len(FAST) + len(slow))
