"""A task's progress: the tool's ``current_call().progress(...)`` reports, as its
``statusMessage`` in Redis, written at most every PROGRESS_WRITE_S (a report held back is
written when that time is up, so the last one always lands)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from toolfleet.adapters.mcp_task_store import TaskRecord, TaskStore
from toolfleet.schemas.progress import CallProgress, ProgressReport

__all__ = ["PROGRESS_WRITE_S", "progress_text", "progress_writer"]

PROGRESS_WRITE_S = 0.2


def progress_writer(
    store: Callable[[], TaskStore], record: TaskRecord, background: set[asyncio.Task[Any]]
) -> Callable[[CallProgress], Awaitable[None]]:
    """A progress callback for the act() of ``record``'s call; a delayed write is kept in
    ``background`` until it is done."""
    state: dict[str, Any] = {"written": 0.0, "pending": None, "flush": None}

    async def write(text: str) -> None:
        state["written"] = time.monotonic()
        await store().annotate(record.task_id, status_message=text)

    async def flush_later(delay: float) -> None:
        await asyncio.sleep(delay)
        text, state["pending"], state["flush"] = state["pending"], None, None
        if text is not None:
            await write(text)

    async def report(progress: CallProgress) -> None:
        text = progress_text(progress)
        wait = state["written"] + PROGRESS_WRITE_S - time.monotonic()
        if wait <= 0 and state["flush"] is None:
            await write(text)
            return
        state["pending"] = text
        if state["flush"] is None:
            flush = asyncio.ensure_future(flush_later(max(wait, 0.0)))
            state["flush"] = flush
            background.add(flush)
            flush.add_done_callback(background.discard)

    return report


def progress_text(progress: CallProgress | ProgressReport) -> str:
    """``3/10: chunk 3``: the counts a report gives, then its message."""
    parts = []
    if progress.total:
        parts.append(f"{progress.done:g}/{progress.total:g}")
    elif progress.done:
        parts.append(f"{progress.done:g}")
    if progress.message:
        parts.append(progress.message)
    return ": ".join(parts)[:1000] or "working"
