"""The documentation is readable from a clone: every relative link in the README,
CONTRIBUTING.md, deploy/README.md, bench/README.md and docs/ names a file inside the
repository, and every test file and test those documents name exists (tests live in
tests/<kind>/, so a moved or renamed test fails here until the documents follow)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A test file, with its folders: tests/unit/test_x.py, tests/support/fleet.py, ...
_TEST_FILE = re.compile(r"\btests/(?:\w+/)*\w+\.py\b")
_TEST_REF = re.compile(r"\b(tests/(?:\w+/)*\w+\.py)::(test_\w+)")
_RULES = [f"D{n}" for n in range(1, 7)] + [f"C{n}" for n in range(1, 11)]


def _documents() -> list[Path]:
    top = [ROOT / name for name in ("README.md", "CONTRIBUTING.md")]
    return [
        *top,
        ROOT / "deploy" / "README.md",
        ROOT / "bench" / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
    ]


def _defines(path: Path, name: str) -> bool:
    text = path.read_text(encoding="utf-8")
    return re.search(rf"^(async )?def {name}\(", text, re.MULTILINE) is not None


def test_the_documents_exist() -> None:
    missing = [str(d.relative_to(ROOT)) for d in _documents() if not d.is_file()]
    assert missing == [], f"documents missing: {missing}"


def test_relative_links_stay_inside_the_repository() -> None:
    wrong: list[str] = []
    for document in _documents():
        for link in _LINK.findall(document.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", link):
                continue  # http://, mailto: ...
            target = (document.parent / link).resolve()
            if not target.is_relative_to(ROOT) or not target.exists():
                wrong.append(f"{document.relative_to(ROOT)}: {link}")
    assert wrong == [], "links to files missing from the repository:\n" + "\n".join(wrong)


def test_every_test_the_documents_name_exists() -> None:
    missing: list[str] = []
    for document in _documents():
        text = document.read_text(encoding="utf-8")
        where = document.relative_to(ROOT)
        for path in sorted(set(_TEST_FILE.findall(text))):
            if not (ROOT / path).is_file():
                missing.append(f"{where}: {path}")
        for path, name in sorted(set(_TEST_REF.findall(text))):
            if (ROOT / path).is_file() and not _defines(ROOT / path, name):
                missing.append(f"{where}: {path}::{name}")
    assert missing == [], "documents name tests that do not exist:\n" + "\n".join(missing)


def test_semantics_states_every_rule_and_names_its_tests() -> None:
    text = (ROOT / "docs" / "semantics.md").read_text(encoding="utf-8")
    assert len(_TEST_REF.findall(text)) > 40  # every rule names its tests
    for rule in _RULES:
        assert re.search(rf"\b{rule}\b", text), f"docs/semantics.md does not state {rule}"
