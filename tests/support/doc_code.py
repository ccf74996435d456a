"""The code the documentation prints: python blocks that open with ``# <file>.py``."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["DOCUMENTS", "doc_blocks", "printed_files"]

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/agent-ecosystem.md")
_BLOCK = re.compile(r"```python\n(# (\S+\.py)[^\n]*\n.*?)```", re.DOTALL)


def doc_blocks(document: str) -> dict[str, str]:
    """The python blocks of ``document`` that open with ``# <file>.py``, by file name."""
    text = (REPO_ROOT / document).read_text(encoding="utf-8")
    return {match.group(2): match.group(1) for match in _BLOCK.finditer(text)}


def printed_files() -> dict[str, str]:
    """Every file the documents print, by file name."""
    files: dict[str, str] = {}
    for document in DOCUMENTS:
        files.update(doc_blocks(document))
    return files
