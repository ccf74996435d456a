"""Every command's --help and exit codes: 2 with a one-line message naming what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli_support import toolfleet
from toolfleet.cli.admin import mask_url


@pytest.mark.parametrize("command", ["run", "demo", "status", "history"])
def test_every_command_has_help_with_examples(command: str, tmp_path: Path) -> None:
    proc = toolfleet(command, "--help", home=tmp_path)
    assert proc.returncode == 0
    assert "Examples:" in proc.stdout and f"toolfleet {command}" in proc.stdout


def _one_line_error(proc: object, *needles: str) -> None:
    stderr: str = proc.stderr  # type: ignore[attr-defined]
    assert proc.returncode == 2, stderr  # type: ignore[attr-defined]
    last = stderr.strip().splitlines()[-1]
    for needle in needles:
        assert needle in last, last


def test_usage_and_configuration_errors_exit_2(tmp_path: Path) -> None:
    batch = tmp_path / "calls.jsonl"
    batch.write_text('{"function": "add", "arguments": {"a": 1, "b": 2}}\n')
    _one_line_error(
        toolfleet("run", str(tmp_path / "missing.jsonl"), "--tools", "m", home=tmp_path),
        "missing.jsonl",
        "does not exist",
    )
    _one_line_error(toolfleet("run", str(batch), home=tmp_path), "--tools", "TOOLFLEET_TOOLS")
    _one_line_error(
        toolfleet("run", str(batch), "--tools", "m", "--max-concurrent", "0", home=tmp_path),
        "--max-concurrent",
    )
    _one_line_error(
        toolfleet("run", str(batch), "--tools", "m", "--strategy", "random", home=tmp_path),
        "--strategy",
    )
    _one_line_error(
        toolfleet("run", str(batch), "--tools", "no_such_tools_mod", home=tmp_path),
        "'no_such_tools_mod'",
        "--tools",
    )
    _one_line_error(
        toolfleet(
            "run", str(batch), "--tools", "tests.support.sample_tools",
            "--output", str(tmp_path / "no" / "dir" / "out.jsonl"), home=tmp_path,
        ),
        "--output",
        "out.jsonl",
    )  # fmt: skip
    # Nothing embedded is running and no broker is configured: nothing to inspect.
    # The hint names what to do now: an embedded fleet is there only while its command runs.
    _one_line_error(toolfleet("status", home=tmp_path), "TOOLFLEET_BROKER_URL", "while a")
    # A broker that does not answer is named (password masked), not retried for minutes.
    dead = {"TOOLFLEET_BROKER_URL": "redis://:pw@127.0.0.1:1/0"}
    for args in (
        ("status",),
        ("history", "some-branch"),
        ("run", str(batch), "--tools", "tests.support.sample_tools"),
    ):
        proc = toolfleet(*args, home=tmp_path, env=dead, timeout_s=30)
        _one_line_error(proc, "127.0.0.1:1", "does not answer", "TOOLFLEET_BROKER_URL")
        assert ":pw@" not in proc.stderr
    # Nothing was started by any of these.
    assert not (tmp_path / ".toolfleet").exists()


def test_a_bad_setting_exits_2_naming_it(tmp_path: Path) -> None:
    batch = tmp_path / "calls.jsonl"
    batch.write_text('{"function": "add", "arguments": {"a": 1, "b": 2}}\n')
    proc = toolfleet(
        "run", str(batch), "--tools", "m", home=tmp_path, env={"TOOLFLEET_MAX_IN_FLIGHT": "lots"}
    )
    _one_line_error(proc, "TOOLFLEET_MAX_IN_FLIGHT")


def test_history_of_an_unknown_branch_exits_1(tmp_path: Path, redis_url: str) -> None:
    proc = toolfleet(
        "history", "no-such-branch", home=tmp_path, env={"TOOLFLEET_BROKER_URL": redis_url}
    )
    assert proc.returncode == 1
    assert "no history stored for branch 'no-such-branch'" in proc.stderr


def test_mask_url_hides_only_the_password() -> None:
    assert mask_url("redis://:s3cret@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert mask_url("redis://user:pw@host/1") == "redis://user:***@host/1"
    assert mask_url("redis://host:6379/0") == "redis://host:6379/0"
