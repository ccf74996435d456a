"""What a person sees at the end of a large ``toolfleet run``, and
``toolfleet status`` counts that agree with each other (against an external Redis and the
test's real workers)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.support.cli_support import (
    REPO_ROOT,
    as_at_a_terminal,
    batch_text,
    cli_env,
    toolfleet,
    toolfleet_argv,
    toolfleet_on_terminal,
)
from tests.support.fleet import WorkerProcess
from tests.support.waiting import until
from toolfleet.cli.call_record import CallRecord
from toolfleet.cli.progress import render_problems

TOOLS = "tests.support.sample_tools"


def _record(line: int, outcome: str, error: str | None) -> CallRecord:
    return CallRecord(line, "f", {}, outcome, outcome, error=error)  # type: ignore[arg-type]


def test_the_problems_table_lists_every_call_that_did_not_complete() -> None:
    records = [_record(n, "done", None) for n in range(1, 200)]
    records[9] = _record(10, "failed", "ValueError: disk on fire")
    records[99] = _record(100, "denied", "denied by governance gate")
    records[149] = _record(150, "malformed", "MalformedRequestError: line 150: not JSON")
    table = render_problems(records)
    assert table is not None
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert "calls that did not complete: 3" in text
    for line, words in ((10, "disk on fire"), (100, "denied"), (150, "not JSON")):
        assert re.search(rf"\b{line}\b.*{words}", text), text
    assert render_problems([_record(1, "done", None)]) is None


@pytest.mark.slow
def test_a_large_run_on_a_terminal_ends_with_its_failures_listed(
    tmp_path: Path, redis_url: str, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    lines = ['{"function": "add", "arguments": {"a": 1, "b": 2}}'] * 80
    lines[9] = '{"function": "fail", "arguments": {"message": "disk on fire"}}'
    lines[29] = "{oops"
    lines[69] = '{"function": "no_such_tool", "arguments": {}}'
    batch = tmp_path / "calls.jsonl"
    batch.write_text(batch_text(lines))
    returncode, screen = toolfleet_on_terminal(
        "run",
        str(batch),
        "--tools",
        TOOLS,
        env=cli_env(tmp_path, {"TERM": "xterm-256color", "TOOLFLEET_BROKER_URL": redis_url}),
        timeout_s=120,
    )
    assert returncode == 1, screen
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    assert "calls that did not complete: 3" in plain, plain
    assert re.search(r"\b10\b.*fail.*disk on fire", plain), plain
    assert re.search(r"\b30\b.*malformed", plain), plain
    assert re.search(r"\b70\b.*no_such_tool", plain), plain
    assert "summary" in plain


@pytest.mark.slow
def test_status_rows_add_up_to_the_calls_in_flight(
    tmp_path: Path, redis_url: str, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    env = {"TOOLFLEET_BROKER_URL": redis_url}
    calls = ['{"function": "sleep_async", "arguments": {"seconds": 60}}'] * 12
    calls += ['{"function": "sleep_sync", "arguments": {"seconds": 20}}']
    batch = tmp_path / "slow.jsonl"
    batch.write_text(batch_text(calls))
    run = subprocess.Popen(
        toolfleet_argv("run", str(batch), "--tools", TOOLS, "--json"),
        cwd=REPO_ROOT,
        env=cli_env(tmp_path, env),
        preexec_fn=as_at_a_terminal,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def all_running() -> dict[str, Any] | None:
            status = toolfleet("status", "--json", home=tmp_path, env=env)
            data: dict[str, Any] = json.loads(status.stdout) if status.returncode == 0 else {}
            rows = {w["hostname"]: w["active"] for w in data.get("workers", [])}
            mine = (rows.get(async_worker.hostname), rows.get(sync_worker.hostname))
            return data if mine == (12, 1) else None

        data = until(all_running, timeout_s=90, interval_s=0.2, what="13 calls running")
        # The rows add up to the total (a call left by another test would be in both).
        rows = {w["hostname"]: w["active"] for w in data["workers"]}
        assert sum(rows.values()) == data["in_flight"] >= len(calls)
        # Wide enough that no hostname is folded across lines.
        table = toolfleet("status", home=tmp_path, env={**env, "COLUMNS": "250"})
        assert table.returncode == 0, table.stderr
        footer = re.search(r"calls in flight: (\d+) running", table.stdout)
        assert footer is not None, table.stdout
        shown = [
            int(m[1])
            for host in rows
            if (m := re.search(rf"{re.escape(host)}\D*(\d+)", table.stdout)) is not None
        ]
        assert sum(shown) == int(footer[1]), table.stdout
    finally:
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
    assert run.returncode == 130
