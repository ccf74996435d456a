"""Embedded runs at the same time are independent.

Run A holds the embedded default's saved data while it waits on a file; run B starts and ends
meanwhile. Each prints its own branch id, and ``toolfleet history`` finds each branch — B's
while A still runs, A's from its running fleet, and both once both have stopped.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.cli_support import cli_env, no_processes_left, read_jsonl, toolfleet_argv
from tests.support.waiting import until

pytestmark = pytest.mark.slow  # real processes: two embedded fleets

GATE_TOOLS = '''
import os

from tests.support.waiting import until_async
from toolfleet.workers.registry import tool


@tool
async def wait_for_file(path: str, timeout_s: float = 120.0) -> str:
    """Return once ``path`` exists (the test creates it): run A stays up until then."""
    await until_async(lambda: os.path.exists(path), timeout_s=timeout_s, what=path)
    return path
'''


def _run(args: list[str], home: Path, cwd: Path) -> subprocess.Popen[str]:
    env = cli_env(home)
    env["PYTHONPATH"] = f"{cwd}:{env['PYTHONPATH']}"
    return subprocess.Popen(
        toolfleet_argv(*args),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _history(branch_id: str, home: Path, cwd: Path) -> list[str]:
    proc = _run(["history", branch_id, "--json"], home, cwd)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    messages = json.loads(stdout)["messages"]
    return [m["content"]["function"] for m in messages if m["role"] == "action_request"]


def test_two_embedded_runs_each_keep_and_show_their_own_history(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "gatetools.py").write_text(GATE_TOOLS)
    gate = tmp_path / "release"
    (tmp_path / "a.jsonl").write_text(
        '{"function": "echo", "arguments": {"value": "a"}}\n'
        + json.dumps({"function": "wait_for_file", "arguments": {"path": str(gate)}})
        + "\n"
    )
    (tmp_path / "b.jsonl").write_text('{"function": "echo", "arguments": {"value": "b"}}\n')
    tools = "tests.support.sample_tools,gatetools"
    out_a_file = tmp_path / "a.out"
    run_a = _run(
        ["run", "a.jsonl", "--tools", tools, "--json", "--output", str(out_a_file)], home, tmp_path
    )
    try:
        # A's fleet is up (it advertises its broker) and holds the saved data.
        until(
            lambda: any((home / ".toolfleet" / "run").glob("*/broker_url")),
            timeout_s=90,
            interval_s=0.1,
            what="run A's embedded fleet",
        )
        run_b = _run(["run", "b.jsonl", "--tools", tools, "--json"], home, tmp_path)
        out_b, err_b = run_b.communicate(timeout=120)
        assert run_b.returncode in (0, 1), err_b
        (record_b,) = read_jsonl(out_b)
        branch_b = str(record_b["branch_id"])
        assert run_a.poll() is None, "run A ended before run B"
        # B stopped and saved its data apart from A's; found while A still runs.
        assert _history(branch_b, home, tmp_path) == ["echo"]
        # A's first result is streamed to its --output; its branch is found in its running
        # fleet (the waiting call is not written yet).
        first_a = until(
            lambda: read_jsonl(out_a_file.read_text()) if out_a_file.exists() else None,
            timeout_s=60,
            interval_s=0.1,
            what="run A's first result",
        )
        assert _history(str(first_a[0]["branch_id"]), home, tmp_path) == ["echo"]
        slots = home / ".toolfleet" / "embedded" / "slots"
        assert [p.name for p in slots.iterdir()] == ["1"]
        gate.write_text("go")
        out_a, err_a = run_a.communicate(timeout=120)
    finally:
        gate.write_text("go")
        if run_a.poll() is None:
            run_a.kill()
            run_a.wait()
    assert run_a.returncode in (0, 1), err_a
    records_a = read_jsonl(out_a)
    assert [r["line"] for r in records_a] == [1, 2]
    branch_a = str(records_a[0]["branch_id"])
    assert branch_a != branch_b
    no_processes_left(home)
    # Both saved: each history is found, each with its own calls only.
    assert _history(branch_a, home, tmp_path) == ["echo", "wait_for_file"]
    assert _history(branch_b, home, tmp_path) == ["echo"]
