"""Issue 11 items 3 and 6, worker side: workers/ has no import cycle counting every import
statement (inside functions, under TYPE_CHECKING, in a module __getattr__), never imports
dispatcher/, and no module in it is over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400


def _modules(package: str) -> dict[str, Path]:
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, name: str) -> set[str]:
    """Every module ``path`` imports, anywhere in it, as dotted names."""
    return _imports_in(path.read_text(), name, is_package=path.name == "__init__.py")


def _imports_in(source: str, name: str, *, is_package: bool = False) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules("workers")
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for target in _imports(path, name):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_workers_has_no_import_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, (
        f"import cycle in workers/: {' -> '.join(cycle or [])}; move what both modules need "
        "into a module both import (as workers.app_info is for workers.app and the task modules)"
    )


def test_workers_never_imports_the_dispatcher() -> None:
    offenders = {
        name: sorted(t for t in _imports(path, name) if t.split(".")[0] == "dispatcher")
        for name, path in _modules("workers").items()
    }
    offenders = {name: targets for name, targets in offenders.items() if targets}
    assert not offenders, f"workers/ imports the dispatcher: {offenders}; use schemas/ instead"


def test_no_workers_module_is_over_400_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in (ROOT / "workers").rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}; split them by noun"


def test_the_checker_counts_imports_in_functions_type_checking_and_relative() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from workers.task import Outcome\n"
        "def f():\n    from workers.app import create_app\n"
        "from . import store\n"
    )
    found = _imports_in(source, "workers.probe")
    assert {"workers.task", "workers.app", "workers.store"} <= found, found
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
