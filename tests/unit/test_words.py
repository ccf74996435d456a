"""Code, docs, bench and tests name rules by what they say, not by a tracker's numbering.

A reference to a tracker's issue or to an item of one means nothing to a reader of a clone;
each rule has an id in docs/semantics.md (D1 to D6, C1 to C10), or its reason fits in a few words.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The package (its folders once: toolfleet/ links to schemas/, dispatcher/ and workers/), the
# documentation, the benchmark and the tests.
_FOLDERS = ("schemas", "dispatcher", "workers", "toolfleet", "docs", "bench", "tests", "deploy")
_FILES = ("README.md", "CONTRIBUTING.md", "pyproject.toml", "docker-compose.yml", ".ci/run")
_TRACKER = re.compile(r"\b[Ii]ssues? #?\d+|\bitems? \d+\b")
_TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".lua", ".sh"}


def _files() -> Iterator[Path]:
    for name in _FILES:
        if (ROOT / name).is_file():
            yield ROOT / name
    for folder in _FOLDERS:
        # os.walk does not follow the links in toolfleet/: each file is read once.
        for directory, subdirectories, names in os.walk(ROOT / folder):
            subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
            for name in sorted(names):
                path = Path(directory, name)
                if path.suffix in _TEXT_SUFFIXES and not path.is_symlink():
                    yield path


def test_no_reference_to_a_tracker_numbering() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if _TRACKER.search(line)
    ]
    assert found == [], (
        "name the rule (docs/semantics.md: D1 to D6, C1 to C10) or its reason instead of a "
        "tracker's issue or item number:\n" + "\n".join(found)
    )


def test_the_pattern_catches_what_it_is_for() -> None:
    # Spelled with a placeholder here, so this file does not match its own pattern.
    caught = [
        text.format(n=12)
        for text in ("see issue {n}", "Issue #{n}", "issues {n} and 4", "item {n} of", "items {n}")
    ]
    passed = ["for item in items", "an issue with it", "items in flight", "C7 and D1"]
    assert all(_TRACKER.search(text) for text in caught)
    assert not any(_TRACKER.search(text) for text in passed)


# The modules of bundles (several calls per toolfleet.execute_many message): "batch" there
# is the act() batch only (batch_id), never a bundle, and the task is named bundle:<fn>:<n>.
_BUNDLE_MODULES = (
    "workers/bundle.py",
    "workers/bundle_store.py",
    "workers/alarm.py",
    "workers/call_events.py",
    "dispatcher/send/bundles.py",
)
_BATCH_WORD = re.compile(r"\b[Bb]atch(?:es|ed|ing)?\b(?!_)")


def test_bundle_modules_say_bundle_and_no_code_names_the_old_task() -> None:
    said = [
        f"{name}:{number}: {line.strip()}"
        for name in _BUNDLE_MODULES
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1)
        if _BATCH_WORD.search(line)
    ]
    assert said == [], "a bundle is a bundle, not a batch:\n" + "\n".join(said)
    old_task = "batch" + ":<"  # split, so this file does not match itself
    named = [str(path.relative_to(ROOT)) for path in _files() if old_task in path.read_text()]
    assert named == [], f"the bundle task is bundle:<function>:<n>, not batch:...: {named}"
