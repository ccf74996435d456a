"""Tests wait on a condition with a deadline (tests/support/waiting.py), never on a sleep: a
sleep long enough on a quiet machine is too short on a loaded one. The modules that once
synchronised by sleeping are held to it here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MENDED = (
    "tests/integration/test_controls.py",
    "tests/integration/test_secrets_masking.py",
    "tests/chaos/test_chaos_progress.py",
)


def _sleeps(path: Path) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "sleep"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in {"time", "asyncio"}
    ]


def test_these_tests_wait_on_redis_state_not_on_a_sleep() -> None:
    found = {name: _sleeps(ROOT / name) for name in MENDED}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_the_check_sees_a_sleep() -> None:
    sample = ROOT / "tests" / "support" / "sample_tools.py"
    assert _sleeps(sample)  # its tools sleep on purpose: simulated work
