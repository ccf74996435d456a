"""``toolfleet run`` end to end: a subprocess with a fresh HOME on the embedded default (a pty
for the progress bar, SIGINT mid-batch), and the same run against an external Redis."""

from __future__ import annotations

import json
import signal
import subprocess
from datetime import datetime
from itertools import pairwise
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
    processes_with_home,
    read_jsonl,
    redis_pids_for,
    toolfleet,
    toolfleet_argv,
    toolfleet_on_terminal,
)
from tests.support.fleet import WorkerProcess
from tests.support.waiting import until
from toolfleet.cli.batch_file import parse_batch

pytestmark = pytest.mark.slow  # real processes: embedded Redis and workers

TOOLS = "tests.support.sample_tools"

MIXED_BATCH = [
    '{"function": "add", "arguments": {"a": 1, "b": 2}}',
    '{"function": "fail", "arguments": {"message": "disk on fire"}}',
    '{"function": "add", "arguments": {"a": 1',  # line 3: truncated JSON
    "",  # blank lines are skipped, not results
    '{"function": "returns_none", "arguments": {}}',
    '{"function": "sleep_async", "arguments": {"seconds": 0.05}}',
    '["not", "an", "object"]',  # line 7
    '{"function": "no_such_tool", "arguments": {}}',
]


# -- pure logic: the batch file ---------------------------------------------------------------


def test_parse_batch_keeps_malformed_lines_with_their_numbers() -> None:
    lines = parse_batch(MIXED_BATCH)
    assert [line.line_no for line in lines] == [1, 2, 3, 5, 6, 7, 8]
    bad = {line.line_no: line.error for line in lines if line.error}
    assert set(bad) == {3, 7}
    assert bad[3] is not None and bad[3].startswith("line 3: not JSON")
    assert bad[7] is not None and "got list" in bad[7]
    assert lines[0].request == {"function": "add", "arguments": {"a": 1, "b": 2}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"arguments": {}}', '"function" must be a non-empty string'),
        ('{"function": "f", "arguments": [1]}', '"arguments" must be a JSON object'),
        ('{"function": "f", "arguments": {}, "x": 1}', "unexpected keys ['x']"),
    ],
)
def test_parse_batch_names_the_problem(text: str, expected: str) -> None:
    [line] = parse_batch(["# a comment", text])
    assert line.line_no == 2
    assert line.error is not None and expected in line.error


# -- end to end on the embedded default ---------------------------------------------------------


def _check_mixed_results(records: list[dict[str, object]]) -> None:
    assert [r["line"] for r in records] == [1, 2, 3, 5, 6, 7, 8]
    by_line = {r["line"]: r for r in records}
    assert by_line[1]["outcome"] == "done" and by_line[1]["output"] == 3
    assert by_line[2]["outcome"] == "failed" and by_line[2]["status"] == "failed"
    assert by_line[2]["error"] == "ValueError: disk on fire"
    assert by_line[2]["error_info"] == {
        "type": "ValueError",
        "module": "builtins",
        "message": "disk on fire",
        "fields": {},
    }
    assert by_line[1]["error_info"] is None
    assert by_line[3]["outcome"] == "malformed"
    assert by_line[3]["error_info"]["type"] == "MalformedRequestError"  # type: ignore[index]
    assert "line 3" in str(by_line[3]["error"])
    # C2: a successful None is a result, not a dropped line.
    assert by_line[5]["outcome"] == "done" and by_line[5]["output"] is None
    assert by_line[6]["outcome"] == "done" and by_line[6]["output"] == 0.05
    assert by_line[7]["outcome"] == "malformed" and "line 7" in str(by_line[7]["error"])
    assert by_line[8]["outcome"] == "failed" and "no_such_tool" in str(by_line[8]["error"])
    assert by_line[8]["error_info"]["type"] == "UnknownToolError"  # type: ignore[index]
    assert len({r["branch_id"] for r in records}) == 1
    for line in (1, 2, 5, 6):
        assert by_line[line]["call_id"]


def test_run_json_on_embedded_default(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    output = tmp_path / "results.jsonl"
    proc = toolfleet(
        "run", "-", "--tools", TOOLS, "--json", "--output", str(output),
        home=home, stdin=batch_text(MIXED_BATCH),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    records = read_jsonl(proc.stdout)
    _check_mixed_results(records)
    assert read_jsonl(output.read_text()) == records
    # Malformed lines are reported on stderr with their numbers; stdout stays pure JSONL.
    assert "line 3: not JSON" in proc.stderr and "line 7:" in proc.stderr
    no_processes_left(home)
    # The per-run directory is removed; the saved Redis data stays for `toolfleet history`.
    assert list((home / ".toolfleet" / "run").iterdir()) == []
    assert (home / ".toolfleet" / "embedded" / "dump.rdb").exists()


def test_run_shows_progress_and_summary_on_a_terminal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    batch = tmp_path / "calls.jsonl"
    slow = '{"function": "sleep_async", "arguments": {"seconds": 2}}'
    fast = ['{"function": "sleep_async", "arguments": {"seconds": 0.1}}'] * 5
    batch.write_text(batch_text([slow, *fast, '{"function": "fail", "arguments": {}}', "{oops"]))
    returncode, screen = toolfleet_on_terminal(
        "run",
        str(batch),
        "--tools",
        TOOLS,
        env=cli_env(home, {"TERM": "xterm-256color"}),
        timeout_s=90,
    )
    assert returncode == 1, screen
    assert "\x1b[" in screen  # drawn for a terminal, with colour and cursor control
    assert "calls/s" in screen and "ETA" in screen
    # The bar counts calls as they finish, not in input order: the fast calls and the
    # malformed line are shown while the slow first call still runs.
    assert "7/8" in screen and "8/8" in screen
    assert "done 6" in screen and "failed 1" in screen and "denied 0" in screen
    assert (
        "malformed" in screen
        and "summary" in screen
        and "slowest: sleep_async" in screen
        and "total time" in screen
    )
    assert "line 8: not JSON" in screen
    no_processes_left(home)


def test_sigint_mid_batch_stops_every_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    batch = tmp_path / "slow.jsonl"
    batch.write_text(
        batch_text(
            ['{"function": "sleep_sync", "arguments": {"seconds": 60}}'] * 2
            + ['{"function": "sleep_async", "arguments": {"seconds": 60}}'] * 2
        )
    )
    with killed_on_exit(
        subprocess.Popen(
            toolfleet_argv("run", str(batch), "--tools", TOOLS, "--json"),
            cwd=REPO_ROOT,
            env=cli_env(home),
            preexec_fn=as_at_a_terminal,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    ) as proc:
        # `toolfleet status` finds the running embedded fleet and sees the calls running.
        def busy() -> dict[str, Any] | None:
            status = toolfleet("status", "--json", home=home)
            if status.returncode != 0:
                return None
            data: dict[str, Any] = json.loads(status.stdout)
            running = sum(w["active"] for w in data["workers"])
            return data if data["in_flight"] == 4 and running == 4 else None

        status = until(busy, timeout_s=60, interval_s=0.2, what="4 calls in flight")
        workers = status["workers"]
        assert len(workers) == 2
        assert {w["active"] for w in workers} == {2}
        assert status["queues"] == {"toolfleet.sync": 0, "toolfleet.async": 0}
        broker = str(status["broker"])
        # A private socket under HOME (or, for a too-long path, a port with a masked password).
        assert broker.startswith(f"redis+socket://{home}/") or ":***@127.0.0.1:" in broker
        assert len(redis_pids_for(broker)) == 1
        # toolfleet, its reaper, two workers and the sync worker's two pool processes.
        assert len(processes_with_home(home)) == 6
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert b"interrupted" in stderr
    no_processes_left(home)
    assert redis_pids_for(broker) == []


# -- the same run against an external Redis ------------------------------------------------------


def test_run_against_external_redis(
    tmp_path: Path, redis_url: str, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"TOOLFLEET_BROKER_URL": redis_url}
    proc = toolfleet(
        "run", "-", "--tools", TOOLS, "--json", home=home, env=env, stdin=batch_text(MIXED_BATCH)
    )
    assert proc.returncode == 1, proc.stderr
    records = read_jsonl(proc.stdout)
    _check_mixed_results(records)
    # Nothing embedded was started: no run directory, no saved data, no process left.
    assert not (home / ".toolfleet").exists()
    no_processes_left(home)

    history = toolfleet("history", str(records[0]["branch_id"]), "--json", home=home, env=env)
    assert history.returncode == 0, history.stderr
    messages = json.loads(history.stdout)["messages"]
    # Five calls reached the branch (the malformed lines never did): a linked pair each.
    assert [m["content"]["function"] for m in messages[::2]] == [
        "add", "fail", "returns_none", "sleep_async", "no_such_tool",
    ]  # fmt: skip
    for request, response in zip(messages[::2], messages[1::2], strict=True):
        assert request["role"] == "action_request" and response["role"] == "action_response"
        assert request["content"]["action_response_id"] == response["id"]
    assert messages[3]["content"]["error"] == "ValueError: disk on fire"

    status = toolfleet("status", "--json", home=home, env=env)
    assert status.returncode == 0, status.stderr
    hostnames = {w["hostname"] for w in json.loads(status.stdout)["workers"]}
    assert {sync_worker.hostname, async_worker.hostname} <= hostnames
    table = toolfleet("status", home=home, env=env)
    assert table.returncode == 0, table.stderr
    assert "workers online" in table.stdout and "toolfleet.sync" in table.stdout
    assert sync_worker.hostname in table.stdout and "calls in flight:" in table.stdout


def test_sequential_strategy_runs_one_call_at_a_time(
    tmp_path: Path, redis_url: str, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    env = {"TOOLFLEET_BROKER_URL": redis_url}
    calls = ['{"function": "sleep_async", "arguments": {"seconds": 0.2}}'] * 3
    proc = toolfleet(
        "run", "-", "--tools", TOOLS, "--json", "--strategy", "sequential",
        home=tmp_path, env=env, stdin=batch_text(calls),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = read_jsonl(proc.stdout)
    assert [r["outcome"] for r in records] == ["done"] * 3
    history = toolfleet("history", str(records[0]["branch_id"]), "--json", home=tmp_path, env=env)
    events = json.loads(history.stdout)["events"]
    assert len(events) == 3
    starts = [datetime.fromisoformat(e["created_at"]).timestamp() for e in events]
    # Each call started only after the previous one had finished its 0.2 s.
    for earlier, later in pairwise(starts):
        assert later - earlier >= 0.2
