"""The code the documentation prints: python blocks that open with ``# <file>.py``."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tests.support.fleet import WorkerProcess, start_worker
from tests.support.redis_server import PrivateRedis

__all__ = ["DOCUMENTS", "doc_blocks", "fleet_for_files", "printed_files"]

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


@contextlib.contextmanager
def fleet_for_files(folder: Path, files: Mapping[str, str], tools: Sequence[str]) -> Iterator[str]:
    """``files`` written to ``folder``, and a private broker with a sync and an async worker
    importing ``tools`` from that folder; yields the broker's URL, all stopped afterwards."""
    for name, code in files.items():
        (folder / name).write_text(code, encoding="utf-8")
    server = PrivateRedis()
    server.start()
    env = {"PYTHONPATH": os.pathsep.join([str(folder), str(REPO_ROOT)])}
    started: list[WorkerProcess] = []
    try:
        for kind in ("sync", "async"):
            started.append(start_worker(kind, redis_url=server.url, tools=tools, env=env))
        yield server.url
    finally:
        for worker in started:
            worker.stop(timeout_s=10)
        server.kill()
