"""Every configuration error is one line naming the setting and the fix, exit
2, on every command — ``worker`` and ``flower`` included — before anything starts."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests.support.cli_support import REPO_ROOT, toolfleet

COMMANDS = {
    "run": ("run", "calls.jsonl", "--tools", "tests.support.sample_tools"),
    "status": ("status",),
    "history": ("history", "some-branch"),
    "recover": ("recover", "some-branch"),
    "worker": ("worker", "--kind", "sync", "--tools", "tests.support.sample_tools"),
    "flower": ("flower", "--port", "5599"),
    "mcp": (
        "mcp",
        "--tools",
        "tests.support.sample_tools",
        "--transport",
        "http",
        "--port",
        "5598",
    ),
}

BAD = {
    "TOOLFLEET_BROKER_URL": {
        "http://u:hunter2@example.invalid:80/0": "scheme 'http://'",
        "127.0.0.1:6379": "no scheme",
        "not a url": "no scheme",
        "redis://:6379/0": "names no host",
        "redis://127.0.0.1:99999/0": "Port out of range",
    },
    "TOOLFLEET_MAX_IN_FLIGHT": {"lots": "TOOLFLEET_MAX_IN_FLIGHT='lots'"},
}


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_bad_setting_is_one_line_and_exit_2_on_every_command(
    command: str, tmp_path: Path
) -> None:
    (tmp_path / "calls.jsonl").write_text('{"function": "add", "arguments": {"a": 1}}\n')
    args = tuple(str(tmp_path / a) if a == "calls.jsonl" else a for a in COMMANDS[command])
    for variable, cases in BAD.items():
        for value, expected in cases.items():
            proc = toolfleet(*args, home=tmp_path, env={variable: value}, timeout_s=60)
            assert proc.returncode == 2, (variable, value, proc.stderr)
            line = _one_line(proc.stderr)
            assert variable in line and expected in line and "fix or unset" in line, line
            assert "hunter2" not in line  # a password in the URL is never printed
    # Nothing was started by any of these.
    assert not (tmp_path / ".toolfleet").exists()


@pytest.mark.parametrize("command", ["worker", "flower", "recover", "status", "history"])
def test_a_broker_that_does_not_answer_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    for url in ("redis://:pw@127.0.0.1:1/0", "redis://nosuchhost.invalid:6379/0"):
        env = {"TOOLFLEET_BROKER_URL": url}
        proc = toolfleet(*COMMANDS[command], home=tmp_path, env=env, timeout_s=60)
        assert proc.returncode == 2, proc.stderr
        line = _one_line(proc.stderr)
        assert "does not answer" in line and "TOOLFLEET_BROKER_URL" in line, line
        assert "pw@" not in line


@pytest.mark.parametrize("command", ["flower", "mcp"])
def test_a_busy_port_is_one_line_naming_it(command: str, tmp_path: Path, redis_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        args = [*COMMANDS[command][:-1], port]
        proc = toolfleet(*args, home=tmp_path, env={"TOOLFLEET_BROKER_URL": redis_url})
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert f"--port {port}" in line and "pass a free --port" in line, proc.stderr
    assert "Traceback" not in proc.stderr


BROKEN_MODULES = {
    "broken_syntax": ("def oops(:\n", "SyntaxError", "broken_syntax.py:1"),
    "broken_raise": (
        "import os\n\nraise RuntimeError('no API key in the environment')\n",
        "RuntimeError",
        "broken_raise.py:3",
    ),
}


@pytest.mark.parametrize("command", ["worker", "tools", "run", "mcp"])
def test_a_tool_module_that_raises_at_import_is_one_line_and_exit_2(
    command: str, tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "calls.jsonl").write_text('{"function": "add", "arguments": {"a": 1}}\n')
    for module, (source, error, where) in BROKEN_MODULES.items():
        (tmp_path / f"{module}.py").write_text(source)
        args = {
            "worker": ("worker", "--kind", "sync", "--tools", module),
            "tools": ("tools", "--tools", module),
            "run": ("run", str(tmp_path / "calls.jsonl"), "--tools", module),
            "mcp": ("mcp", "--tools", module),
        }[command]
        env = {
            "TOOLFLEET_BROKER_URL": redis_url,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)]),
        }
        proc = toolfleet(*args, home=tmp_path, env=env, timeout_s=60)
        assert proc.returncode == 2, proc.stderr
        line = _one_line(proc.stderr)
        assert f"tool module {module!r}" in line and error in line and where in line, line
