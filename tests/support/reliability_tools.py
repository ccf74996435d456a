"""Tools for the reliability tests: each run leaves a line naming its process, so a test
can count runs and find the prefork child to kill. Workers load this module with --tools."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from toolfleet.workers.registry import tool

__all__ = [
    "SearchRequest",
    "mark_then_sleep",
    "mark_then_sleep_once",
    "search",
    "sleep_then_mark",
]


def _mark(path: str) -> int:
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"run {os.getpid()}\n")
    return sum(1 for _ in Path(path).open(encoding="utf-8"))


@tool
def mark_then_sleep(path: str, seconds: float) -> int:
    """Not idempotent: a second run would repeat the side effect."""
    runs = _mark(path)
    time.sleep(seconds)
    return runs


@tool(idempotent=True)
def mark_then_sleep_once(path: str, seconds: float) -> int:
    """Declared safe to re-run; only its first run sleeps, so a re-run finishes at once."""
    runs = _mark(path)
    if runs == 1:
        time.sleep(seconds)
    return runs


@tool
def sleep_then_mark(path: str, seconds: float) -> int:
    """Not idempotent; its side effect comes last, so 'finished' is easy to observe."""
    time.sleep(seconds)
    return _mark(path)


class SearchRequest(BaseModel):
    """A request model: the dispatcher validates types before anything is enqueued."""

    model_config = ConfigDict(extra="forbid")

    query: str
    limit: int = 10
    api_key: str | None = None


@tool(request_options=SearchRequest, secret_args=("api_key",))
def search(query: str, limit: int = 10, api_key: str | None = None) -> list[str]:
    return [query] * limit
