"""The tools ``toolfleet demo`` runs; a worker loads them with
``--tools toolfleet.cli.demo_tools``.

Each tool reports the process it ran in, so the demo can show that blocking sync tools ran in
worker processes and never on the caller's event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from typing import Any

from toolfleet.workers.registry import tool

__all__ = ["DENIED_TOOL", "checksum_file", "delete_files", "fetch_page", "parse_number"]

# The demo's governance gate refuses this tool, so the call never reaches a worker.
DENIED_TOOL = "delete_files"


@tool
def checksum_file(name: str, size_kb: int = 256, block_s: float = 0.4) -> dict[str, Any]:
    """A blocking sync tool: sleeps (as slow disk or network I/O would) and hashes bytes."""
    started = time.monotonic()
    time.sleep(block_s)
    digest = hashlib.sha256(name.encode() * (size_kb * 1024 // max(1, len(name)))).hexdigest()
    return {
        "name": name,
        "sha256": digest[:16],
        "pid": os.getpid(),
        "blocked_s": round(time.monotonic() - started, 3),
    }


@tool
async def fetch_page(page: int, latency_s: float = 0.3) -> dict[str, Any]:
    """An async tool: waits on (simulated) network latency without blocking its pool."""
    started = time.monotonic()
    await asyncio.sleep(latency_s)
    return {
        "page": page,
        "title": f"Page {page}",
        "pid": os.getpid(),
        "started_at": started,
        "waited_s": round(time.monotonic() - started, 3),
    }


@tool
def parse_number(text: str) -> float:
    """A tool that fails on bad input; its error comes back as the call's truthful result."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"cannot parse {text!r} as a number") from None


@tool
def delete_files(pattern: str) -> int:
    """A dangerous tool the demo's gate denies; it must never run."""
    raise RuntimeError(f"delete_files({pattern!r}) ran although the demo's gate denies it")
