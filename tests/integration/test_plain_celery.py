"""The plain-Celery recipe of docs/cli.md works as written.

``TOOLFLEET_TOOLS=mytools celery -A toolfleet.workers.app worker -Q toolfleet.sync`` is run from a
directory holding ``mytools.py`` (not on PYTHONPATH, as for a user), and ``toolfleet run`` from
the same directory gets the tool's result; a tool module that does not import stops the worker
with one line and exit 2 instead of a worker that fails every call.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_support import REPO_ROOT, read_jsonl, toolfleet_argv
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until
from toolfleet.schemas.settings import Settings
from toolfleet.workers.app import create_app

pytestmark = pytest.mark.slow

MYTOOLS = """
from toolfleet.workers.registry import tool


@tool
def double(x: int) -> int:
    return 2 * x
"""


def _env(broker_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    # toolfleet itself importable (an installed package for a user), the project dir not.
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["TOOLFLEET_BROKER_URL"] = broker_url
    env.update(extra)
    return env


def _celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", *args]


def test_the_documented_recipe_runs_a_tool_from_the_working_directory(
    tmp_path: Path, broker: PrivateRedis
) -> None:
    cli_doc = (REPO_ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert (
        "TOOLFLEET_TOOLS=mytools celery -A toolfleet.workers.app worker -Q toolfleet.sync"
        in cli_doc
    )
    (tmp_path / "mytools.py").write_text(MYTOOLS)
    (tmp_path / "calls.jsonl").write_text('{"function": "double", "arguments": {"x": 21}}\n')
    log_path = tmp_path / "celery.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            _celery("-A", "toolfleet.workers.app", "worker", "-Q", "toolfleet.sync", "-c", "1"),
            cwd=tmp_path,
            env=_env(broker.url, TOOLFLEET_TOOLS="mytools"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    app = create_app(Settings(broker_url=broker.url))
    try:
        until(
            lambda: worker.poll() is not None or app.control.ping(timeout=0.5),
            timeout_s=60,
            what=f"the plain celery worker to answer a ping (log: {log_path})",
        )
        assert worker.poll() is None, log_path.read_text()
        run = subprocess.run(
            toolfleet_argv("run", "calls.jsonl", "--tools", "mytools", "--json"),
            cwd=tmp_path,
            env=_env(broker.url),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, (run.stderr, log_path.read_text())
        (record,) = read_jsonl(run.stdout)
        assert record["outcome"] == "done" and record["output"] == 42
    finally:
        app.close()
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def test_a_tool_module_that_does_not_import_stops_the_worker_with_one_line(
    tmp_path: Path, broker: PrivateRedis
) -> None:
    proc = subprocess.run(
        _celery("-A", "toolfleet.workers.app", "worker", "-Q", "toolfleet.sync", "-c", "1"),
        cwd=tmp_path,
        env=_env(broker.url, TOOLFLEET_TOOLS="no_such_tools_module"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "configuration error: tool module 'no_such_tools_module'" in proc.stderr
    assert "Traceback" not in proc.stderr
