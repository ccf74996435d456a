"""Every command ends quietly when the reader of its stdout goes away (``| head``): exit 141,
as a Unix tool SIGPIPE ends, and no traceback (toolfleet/cli/__init__.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tests.support.cli_support import REPO_ROOT, cli_env, read_jsonl, toolfleet, toolfleet_argv
from tests.support.fleet import private_workers
from toolfleet.cli import EXIT_READER_GONE

TOOLS = ("--tools", "tests.support.sample_tools")


def _into_a_closed_pipe(
    *args: str, home: Path, env: Mapping[str, str] | None = None, exit_code: int = EXIT_READER_GONE
) -> str:
    """Run ``toolfleet ARGS`` with stdout a pipe whose reader has already gone (as ``head``
    after its last line); its stderr, once it exited with ``exit_code``."""
    proc = subprocess.Popen(
        toolfleet_argv(*args),
        cwd=REPO_ROOT,
        env=cli_env(home, env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader goes away before the first write
    try:
        stderr = proc.stderr.read().decode(errors="replace")
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == exit_code, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    return stderr


def test_tools_into_a_closed_pipe_exits_141_without_a_traceback(tmp_path: Path) -> None:
    stderr = _into_a_closed_pipe("tools", "--tools", "tests.support.sample_tools", home=tmp_path)
    assert stderr == ""


def test_history_into_a_closed_pipe_exits_141_and_run_finishes_its_batch(
    tmp_path: Path, redis_url: str
) -> None:
    with private_workers(redis_url, "pipe", concurrency={"async": 4}) as env:
        batch = tmp_path / "calls.jsonl"
        batch.write_text(
            "".join(
                json.dumps({"function": "count_async", "arguments": {"n": n}}) + "\n"
                for n in range(3)
            )
        )
        ran = toolfleet("run", str(batch), "--json", *TOOLS, home=tmp_path, env=env)
        assert ran.returncode == 0, ran.stderr
        branch_id = read_jsonl(ran.stdout)[0]["branch_id"]
        for args in (("history", branch_id, "--json"), ("history", branch_id)):
            assert _into_a_closed_pipe(*args, home=tmp_path, env=env) == ""
        # run --json finishes its batch (the calls are on the fleet, --output still gets every
        # line) and exits by the calls' outcome.
        _into_a_closed_pipe(
            "run", str(batch), "--json", *TOOLS, home=tmp_path, env=env, exit_code=0
        )
