"""toolfleet bounds its awaits with ``asyncio.timeout``, never ``asyncio.wait_for``.

On Python 3.11 (the oldest toolfleet supports) ``wait_for`` returns its awaitable's result
and drops a cancellation that arrives in the loop turn in which that awaitable finished: the
task runs on as if never cancelled, and ``asyncio.run``'s one final cancel of a failed
program's pending act() was lost that way (tests/integration/test_blocked_loop_exit.py).
``asyncio.timeout`` counts cancellations (``Task.cancelling()``) and never drops one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dispatcher", "schemas", "workers", "toolfleet")


def _wait_for_uses(path: Path) -> list[int]:
    """The lines of ``path`` that call ``asyncio.wait_for`` or import it from asyncio."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "asyncio":
            if any(alias.name == "wait_for" for alias in node.names):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "wait_for"
            and isinstance(node.value, ast.Name)
            and node.value.id == "asyncio"
        ):
            lines.append(node.lineno)
    return lines


def test_no_module_bounds_an_await_with_asyncio_wait_for() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if not any(part.is_symlink() for part in (path, *path.parents) if part != ROOT)
        for line in _wait_for_uses(path)
    ]
    assert found == [], (
        "use `async with asyncio.timeout(seconds): await ...` instead of asyncio.wait_for, "
        "which drops a cancellation on Python 3.11:\n" + "\n".join(found)
    )
