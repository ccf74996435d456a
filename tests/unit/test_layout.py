"""The layout rules of docs/layout.md, read from the source: the import graph of toolfleet's
packages counts every import statement (inside functions, under TYPE_CHECKING, in a module
__getattr__ too), and the dispatcher's step table is checked against its folders."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where each part of the toolfleet package lives in the checkout.
PARTS = {
    "toolfleet.schemas": ROOT / "schemas",
    "toolfleet.broker": ROOT / "toolfleet" / "broker",
    "toolfleet.dispatcher": ROOT / "dispatcher",
    "toolfleet.workers": ROOT / "workers",
    "toolfleet.cli": ROOT / "toolfleet" / "cli",
    "toolfleet.adapters": ROOT / "toolfleet" / "adapters",
    "toolfleet.embedded": ROOT / "toolfleet" / "embedded",
}
MAX_LINES = 400
# What the dispatcher may import from workers/: what creates the app (app; app_info holds its
# accessors) and the registry (registry; specs renders its tools for a model).
DISPATCHER_MAY_IMPORT = frozenset(
    {
        "toolfleet.workers.app",
        "toolfleet.workers.app_info",
        "toolfleet.workers.registry",
        "toolfleet.workers.specs",
    }
)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {"toolfleet": ROOT / "toolfleet" / "__init__.py"}
    for part, folder in PARTS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [*part.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _under(name: str, part: str) -> bool:
    return name == part or name.startswith(part + ".")


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
        "if TYPE_CHECKING:\n    import toolfleet.workers.app\n"
        "def late():\n    from toolfleet.dispatcher import branch\n    from . import fleet\n"
    )
    names = _imported_names("toolfleet.dispatcher.probe", source)
    assert {
        "toolfleet.workers.app",
        "toolfleet.dispatcher.branch",
        "toolfleet.dispatcher.fleet",
    } <= set(names)
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from toolfleet.workers.call_runner import Outcome\n"
        "def f():\n    from toolfleet.workers.app import create_app\n"
        "from . import store\n"
    )
    names = _imported_names("toolfleet.workers.probe", source)
    assert {
        "toolfleet.workers.call_runner",
        "toolfleet.workers.app",
        "toolfleet.workers.store",
    } <= set(names), names
    assert _ours("toolfleet.dispatcher.branch.Branch") == "toolfleet.dispatcher.branch"
    assert _find_cycle({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b": 1}, "b": {"a": 2}}) == ["a", "b", "a"]
    assert _find_cycle({"a": {"b": 1}, "b": {}}) is None


def test_no_import_cycle() -> None:
    graph = _graph()
    cycle = _find_cycle(graph)
    assert cycle is None, (
        _describe(cycle, graph) + "\nmove what both modules need into a module both import "
        "(as toolfleet.workers.app_info is for toolfleet.workers.app and the task modules)"
        if cycle
        else ""
    )


def _imports_from(package: str, forbidden: frozenset[str]) -> list[str]:
    """Each import, anywhere in ``package``, of a module under one of ``forbidden``."""
    return [
        f"{name} imports {imported} (line {line})"
        for name, path in MODULES.items()
        if _under(name, package)
        for imported, line in _imported_names(name, path).items()
        if any(_under(imported, part) for part in forbidden) or imported == "toolfleet"
    ]


def test_schemas_import_nothing_else_of_ours() -> None:
    wrong = _imports_from("toolfleet.schemas", frozenset(PARTS) - {"toolfleet.schemas"})
    assert wrong == [], "schemas/ is the wire contract and imports nothing else of ours:\n" + (
        "\n".join(wrong)
    )


def test_broker_imports_only_schemas() -> None:
    wrong = _imports_from(
        "toolfleet.broker", frozenset(PARTS) - {"toolfleet.schemas", "toolfleet.broker"}
    )
    assert wrong == [], "broker/ is the runtime both sides share; it imports only schemas/:\n" + (
        "\n".join(wrong)
    )


def test_workers_never_imports_the_dispatcher() -> None:
    wrong = _imports_from(
        "toolfleet.workers",
        frozenset({"toolfleet.dispatcher", "toolfleet.cli", "toolfleet.adapters"}),
    )
    assert wrong == [], "workers/ imports the dispatcher; use schemas/ instead:\n" + (
        "\n".join(wrong)
    )


def test_dispatcher_imports_from_workers_only_the_app_and_the_registry() -> None:
    graph = _graph()
    wrong = [
        f"{name} imports {target} (line {line})"
        for name, edges in graph.items()
        if _under(name, "toolfleet.dispatcher")
        for target, line in edges.items()
        if (_under(target, "toolfleet.workers") and target not in DISPATCHER_MAY_IMPORT)
        or _under(target, "toolfleet.cli")
        or _under(target, "toolfleet.adapters")
        or target == "toolfleet"
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


STEP_TABLE = ROOT / "docs" / "layout.md"
STEP_ROW = re.compile(r"^\| (\w+) \| `(dispatcher/(?:\w+/)?)` \| (.+) \|$", re.M)


def test_step_table_matches_the_folders() -> None:
    rows = STEP_ROW.findall(STEP_TABLE.read_text())
    assert rows, f"no step table in {STEP_TABLE}"
    listed: dict[str, str] = {}
    wrong = []
    for step, folder, cell in rows:
        for module in re.findall(r"`(\w+)`", cell):
            path = ROOT / folder / f"{module}.py"
            if not path.is_file():
                wrong.append(f"step {step} names {folder}{module}.py, which does not exist")
            listed[str(path.relative_to(ROOT))] = step
    for path in sorted((ROOT / "dispatcher").rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        if path.name != "__init__.py" and relative not in listed:
            wrong.append(f"{relative} is in no step of {STEP_TABLE.name}'s table: add it to a row")
    assert wrong == [], "\n".join(wrong)


# The dispatcher's layers: the step table's rows, top to bottom. A module imports only
# modules of its own step and of the steps in rows below it (nothing up, nothing sideways).
DISPATCHER = "toolfleet.dispatcher"


def _steps() -> list[tuple[str, str, list[str]]]:
    """(step, folder, modules) of each row of the step table, top row first."""
    return [
        (step, folder, re.findall(r"`(\w+)`", cell))
        for step, folder, cell in STEP_ROW.findall(STEP_TABLE.read_text())
    ]


def _step_of(module: str, steps: list[tuple[str, str, list[str]]]) -> str | None:
    """The step (row) a dispatcher module belongs to: its folder's, or for a module directly
    in dispatcher/ the row that names it; None for the dispatcher's own __init__ and modules
    outside the dispatcher."""
    if not _under(module, DISPATCHER) or module == DISPATCHER:
        return None
    parts = module.removeprefix(DISPATCHER + ".").split(".")
    for step, folder, names in steps:
        inside = folder.removeprefix("dispatcher/").rstrip("/")
        if (inside and parts[0] == inside) or (
            not inside and len(parts) == 1 and parts[0] in names
        ):
            return step
    return None


def _layer_violations(
    graph: dict[str, dict[str, int]], steps: list[tuple[str, str, list[str]]]
) -> list[str]:
    rank = {step: index for index, (step, _, _) in enumerate(steps)}
    wrong = []
    for name, edges in sorted(graph.items()):
        here = _step_of(name, steps)
        if here is None:
            continue
        for target, line in sorted(edges.items()):
            if target == DISPATCHER:
                wrong.append(
                    f"{name} (line {graph[name][target]}) imports {target}, the dispatcher's "
                    "public face above every step: import the module that defines the name"
                )
                continue
            there = _step_of(target, steps)
            if there is not None and rank[there] < rank[here]:
                wrong.append(
                    f"{name} (step {here}, line {line}) imports {target} (step {there}): up a layer"
                )
    return wrong


def test_the_layer_check_names_both_modules_of_an_import_that_goes_up() -> None:
    steps = [
        ("entry", "dispatcher/", ["branch"]),
        ("batch", "dispatcher/batch/", ["act"]),
        ("send", "dispatcher/send/", ["enqueue"]),
    ]
    d = DISPATCHER
    graph = {
        f"{d}.branch": {f"{d}.batch.act": 1, f"{d}.send.enqueue": 2},
        f"{d}.batch.act": {f"{d}.send.enqueue": 3},
        f"{d}.send.enqueue": {f"{d}.batch.act": 4, f"{d}.branch": 5},
    }
    wrong = _layer_violations(graph, steps)
    assert len(wrong) == 2, wrong
    assert f"{d}.send.enqueue (step send" in wrong[0] and f"imports {d}.batch.act" in wrong[0]
    assert f"imports {d}.branch (step entry)" in wrong[1]
    assert _layer_violations({f"{d}.batch.act": {d: 7}}, steps)  # the public face is the top
    assert _step_of(f"{d}.sync_run", steps) is None  # in dispatcher/, in no row
    assert _step_of("toolfleet.schemas.keys", steps) is None


def test_dispatcher_steps_import_only_the_steps_below_them() -> None:
    steps = _steps()
    order = [step for step, _, _ in steps]
    assert len(set(order)) == len(order), f"a step has two rows in {STEP_TABLE.name}: {order}"
    wrong = _layer_violations(_graph(), steps)
    assert wrong == [], (
        f"the steps of {STEP_TABLE.name}'s table are layers, top row first ({' > '.join(order)});"
        " a module imports only its own step's modules and the steps below it. Move what both "
        "need down, or have the lower module declare what it needs as a Protocol:\n"
        + "\n".join(wrong)
    )
