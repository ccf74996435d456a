"""Coverage is measured over the whole package: schemas/, dispatcher/ and workers/ too,
which the links in toolfleet/ hide from a path-based source, and .ci/run prints the figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_coverage_follows_the_package_and_its_linked_folders() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["coverage"]["run"]
    assert config["source_pkgs"] == ["toolfleet"]
    linked = sorted(p.name for p in (ROOT / "toolfleet").iterdir() if p.is_symlink())
    assert sorted(config["source"]) == linked == ["dispatcher", "schemas", "workers"]
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["test"]
    assert any(r.startswith("pytest-cov") for r in test_extra)


def test_a_module_no_test_imports_still_counts(tmp_path: Path) -> None:
    """Measured as .ci/run measures (this configuration), a run that imports one module
    reports every module of the package, the linked folders' included, at 0% if unrun."""
    env = {**os.environ, "COVERAGE_FILE": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    measure = [sys.executable, "-m", "coverage"]
    script = tmp_path / "one_import.py"
    script.write_text("import toolfleet.schemas.keys\n")
    subprocess.run(
        [*measure, "run", str(script)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    report = tmp_path / "report.json"
    subprocess.run(
        [*measure, "json", "-o", str(report)], cwd=ROOT, env=env, check=True, capture_output=True
    )
    files = json.loads(report.read_text())["files"]
    assert files["schemas/keys.py"]["summary"]["percent_covered"] > 0
    assert files["workers/aio_pool.py"]["summary"]["covered_lines"] == 0  # never imported
    wanted = {
        str(path.relative_to(ROOT))
        for folder in ("schemas", "dispatcher", "workers")
        for path in (ROOT / folder).rglob("*.py")
        if path.stat().st_size
    }
    assert wanted <= set(files), sorted(wanted - set(files))[:5]
    assert "toolfleet/cli/run.py" in files


def test_ci_prints_the_figure_of_the_default_run() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -q -n 3 --cov " in run
    assert "coverage report --format=total" in run
