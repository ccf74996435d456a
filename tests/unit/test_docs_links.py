"""The documentation is readable from a clone (issue 11 item 7): every relative link in the
README and docs/ names a file inside the repository, and every test docs/semantics.md names
exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_TEST_REF = re.compile(r"(tests/(?:\w+/)*\w+\.py)::(test_\w+)")


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_relative_links_stay_inside_the_repository() -> None:
    wrong: list[str] = []
    for document in _documents():
        for link in _LINK.findall(document.read_text()):
            if re.match(r"[a-z]+:", link):
                continue  # http://, mailto: ...
            target = (document.parent / link).resolve()
            if not target.is_relative_to(ROOT) or not target.exists():
                wrong.append(f"{document.relative_to(ROOT)}: {link}")
    assert wrong == [], "links to files missing from the repository:\n" + "\n".join(wrong)


def test_semantics_names_only_tests_that_exist() -> None:
    text = (ROOT / "docs" / "semantics.md").read_text()
    references = _TEST_REF.findall(text)
    assert len(references) > 40  # every rule names its tests
    missing = [
        f"{path}::{name}"
        for path, name in references
        if not (ROOT / path).is_file()
        or not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.MULTILINE)
    ]
    assert missing == [], f"docs/semantics.md names tests that do not exist: {missing}"
    for rule in [f"D{n}" for n in range(1, 7)] + [f"C{n}" for n in range(1, 11)]:
        assert re.search(rf"\b{rule}\b", text), f"docs/semantics.md does not state {rule}"
