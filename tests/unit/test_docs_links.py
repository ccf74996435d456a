"""The documentation is readable from a clone: every relative link in the README,
CONTRIBUTING.md, deploy/README.md, bench/README.md and docs/ names a file inside the
repository, and every test file and test those documents name exists (tests live in
tests/<kind>/, so a moved or renamed test fails here until the documents follow). The code's
comments and docstrings and pyproject.toml are held to the same: a test path they name
exists."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A test file, with its folders: tests/<kind>/test_<name>.py, tests/support/fleet.py, ...
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


# The Python that may name tests: the package (its real folders, not the links in
# toolfleet/), the tests themselves, the benchmarks and the deployment examples.
_CODE_FOLDERS = ("schemas", "dispatcher", "workers", "toolfleet", "tests", "bench", "deploy")


def _code_files() -> list[Path]:
    found = []
    for folder in _CODE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            # toolfleet/schemas etc. are links to the folders above: read each file once.
            if not any(p.is_symlink() for p in path.relative_to(ROOT).parents if p.parts):
                found.append(path)
    return found


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of ``path``."""
    source = path.read_text(encoding="utf-8")
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    return found


def _missing_tests(where: str, text: str) -> list[str]:
    missing = [
        f"{where}: {path}"
        for path in sorted(set(_TEST_FILE.findall(text)))
        if not (ROOT / path).is_file()
    ]
    for path, name in sorted(set(_TEST_REF.findall(text))):
        if (ROOT / path).is_file() and not _defines(ROOT / path, name):
            missing.append(f"{where}: {path}::{name}")
    return missing


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
        missing += _missing_tests(str(document.relative_to(ROOT)), text)
    assert missing == [], "documents name tests that do not exist:\n" + "\n".join(missing)


def test_every_test_the_code_and_pyproject_name_exists() -> None:
    """A comment or docstring pointing to a test that moved misleads as much as a doc."""
    files = _code_files()
    assert len(files) > 200 and ROOT / "schemas" / "errors.py" in files
    assert not any("toolfleet/schemas" in str(f.relative_to(ROOT)) for f in files)
    missing: list[str] = []
    for path in files:
        for line, text in _comments_and_docstrings(path):
            missing += _missing_tests(f"{path.relative_to(ROOT)}:{line}", text)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    missing += _missing_tests("pyproject.toml", pyproject)
    assert missing == [], "code names tests that do not exist:\n" + "\n".join(missing)


def test_semantics_states_every_rule_and_names_its_tests() -> None:
    text = (ROOT / "docs" / "semantics.md").read_text(encoding="utf-8")
    assert len(_TEST_REF.findall(text)) > 40  # every rule names its tests
    for rule in _RULES:
        assert re.search(rf"\b{rule}\b", text), f"docs/semantics.md does not state {rule}"
