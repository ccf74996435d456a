"""The layout rules of issue 11 (items 3 and 6), read from the source: the import graph of
schemas/, dispatcher/ and workers/ counts every import statement (inside functions, under
TYPE_CHECKING, in a module __getattr__ too)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("schemas", "dispatcher", "workers")
OURS = (*PACKAGES, "tests", "bench")
MAX_LINES = 400
# What the dispatcher may import from workers/: what creates the app (app; app_info holds its
# accessors) and the registry (registry; specs renders its tools for a model), plus the
# publisher of execute_many messages, whose format is the batch task's.
DISPATCHER_MAY_IMPORT = frozenset(
    {
        "workers.app",
        "workers.app_info",
        "workers.registry",
        "workers.specs",
        "workers.batch_publish",
    }
)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imported_names(name: str, path: Path) -> dict[str, int]:
    """Every module name ``name`` imports (as written, absolute), with its first line."""
    names: dict[str, int] = {}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            names.setdefault(base, node.lineno)
            for alias in node.names:
                # ``from pkg import mod`` imports the module pkg.mod.
                names.setdefault(f"{base}.{alias.name}", node.lineno)
    return names


def _ours(imported: str) -> str | None:
    """The module of ours that ``imported`` names (its longest known prefix), if any."""
    candidate = imported
    while candidate:
        if candidate in MODULES:
            return candidate
        candidate = candidate.rpartition(".")[0]
    return None


def _graph() -> dict[str, dict[str, int]]:
    graph: dict[str, dict[str, int]] = {}
    for name, path in MODULES.items():
        edges: dict[str, int] = {}
        for imported, line in _imported_names(name, path).items():
            target = _ours(imported)
            if target is not None and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def _find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle as a path a -> b -> ... -> a, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found is not None:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found is not None:
                return found
    return None


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [
        f"{a} (line {graph[a][b]} of {MODULES[a].relative_to(ROOT)}) -> {b}"
        for a, b in itertools.pairwise(cycle)
    ]
    return "import cycle:\n  " + "\n  ".join(steps)


def test_the_graph_counts_imports_inside_functions_and_under_type_checking(
    tmp_path: Path,
) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import workers.app\n"
        "def late():\n    from dispatcher import branch\n    from . import fleet\n"
    )
    names = _imported_names("dispatcher.probe", source)
    assert {"workers.app", "dispatcher.branch", "dispatcher.fleet"} <= set(names)
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from workers.task import Outcome\n"
        "def f():\n    from workers.app import create_app\n"
        "from . import store\n"
    )
    names = _imported_names("workers.probe", source)
    assert {"workers.task", "workers.app", "workers.store"} <= set(names), names
    assert _ours("dispatcher.branch.Branch") == "dispatcher.branch"
    assert _find_cycle({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b": 1}, "b": {"a": 2}}) == ["a", "b", "a"]
    assert _find_cycle({"a": {"b": 1}, "b": {}}) is None


def test_no_import_cycle_in_schemas_dispatcher_workers() -> None:
    graph = _graph()
    cycle = _find_cycle(graph)
    assert cycle is None, (
        _describe(cycle, graph) + "\nmove what both modules need into a module both import "
        "(as workers.app_info is for workers.app and the task modules)"
        if cycle
        else ""
    )


def _imports_from(package: str, forbidden: frozenset[str]) -> list[str]:
    """Each import, anywhere in ``package``, of a module under one of ``forbidden``."""
    return [
        f"{name} imports {imported} (line {line})"
        for name, path in MODULES.items()
        if name.split(".")[0] == package
        for imported, line in _imported_names(name, path).items()
        if imported.split(".")[0] in forbidden
    ]


def test_schemas_import_nothing_else_of_ours() -> None:
    wrong = _imports_from("schemas", frozenset(OURS) - {"schemas"})
    assert wrong == [], "schemas/ is the wire contract and imports nothing else of ours:\n" + (
        "\n".join(wrong)
    )


def test_workers_never_imports_the_dispatcher() -> None:
    wrong = _imports_from("workers", frozenset({"dispatcher"}))
    assert wrong == [], "workers/ imports the dispatcher; use schemas/ instead:\n" + (
        "\n".join(wrong)
    )


def test_dispatcher_imports_from_workers_only_the_app_and_the_registry() -> None:
    graph = _graph()
    wrong = [
        f"{name} imports {target} (line {line})"
        for name, edges in graph.items()
        if name.split(".")[0] == "dispatcher"
        for target, line in edges.items()
        if target.split(".")[0] == "workers" and target not in DISPATCHER_MAY_IMPORT
    ]
    assert wrong == [], (
        f"dispatcher/ may import from workers/ only {sorted(DISPATCHER_MAY_IMPORT)}:\n"
        + "\n".join(wrong)
    )


def test_no_module_over_400_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in MODULES.values()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these by noun (at most {MAX_LINES} lines each): {long}"
