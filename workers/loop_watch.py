"""Names the tool that blocks the asyncio pool's event loop.

An ``async def`` tool that calls ``time.sleep`` (or any blocking client) stalls every call on
its worker, silently. The pool's loop beats every :data:`BEAT_S`; a watcher thread notices
when a beat is late by more than :data:`BLOCK_WARN_S`, reads the loop thread's stack to find
which tool's code is running (and its call id), and once the loop beats again logs one
warning naming the tool and how long it held the loop, at most once per tool per
:data:`WARN_EVERY_S` (later ones are counted in the next warning).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import CodeType, FrameType

__all__ = ["BEAT_S", "BLOCK_WARN_S", "WARN_EVERY_S", "LoopWatch", "code_of"]

log = logging.getLogger(__name__)

BEAT_S = 0.1
# A beat later than this is a blocked loop (a loaded machine's scheduling stays well below).
BLOCK_WARN_S = 0.5
WARN_EVERY_S = 60.0
# The worker's function whose frame holds the call being run (its `msg` local).
_CALL_FRAME = "_run_tool"


class LoopWatch:
    """Watches ``loop`` (run by the thread ``loop_thread_id``) from a daemon thread.

    ``tool_codes`` maps the code object of each registered tool's function to its name; it
    is read when a block is found, so tools registered later are known too."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        loop_thread_id: int,
        tool_codes: Callable[[], Mapping[CodeType, str]],
    ) -> None:
        self._loop = loop
        self._loop_thread_id = loop_thread_id
        self._tool_codes = tool_codes
        self._last_beat = time.monotonic()
        self._stopped = threading.Event()
        self._warned_at: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._thread = threading.Thread(
            target=self._watch, name="toolfleet-loop-watch", daemon=True
        )

    def start(self) -> None:
        """Begin beating (call on the loop's thread, or before the loop runs) and watching."""
        self._loop.call_soon_threadsafe(self._beat)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _beat(self) -> None:
        self._last_beat = time.monotonic()
        if not self._stopped.is_set():
            self._loop.call_later(BEAT_S, self._beat)

    def _watch(self) -> None:
        held_by: tuple[str, str | None] | None = None
        since = 0.0
        while not self._stopped.wait(BEAT_S):
            last = self._last_beat
            late_s = time.monotonic() - last
            if held_by is None and late_s > BLOCK_WARN_S + BEAT_S:
                held_by = self._running_tool()
                since = last
            elif held_by is not None and late_s <= BLOCK_WARN_S + BEAT_S:
                # The loop beat again: the hold ended at (about) that beat.
                self._report(held_by, last - since)
                held_by = None

    def _running_tool(self) -> tuple[str, str | None] | None:
        """The tool (name, call id) whose code is on the loop thread's stack, if any."""
        frame: FrameType | None = sys._current_frames().get(self._loop_thread_id)
        codes = self._tool_codes()
        tool: str | None = None
        call_id: str | None = None
        while frame is not None:
            if tool is None:
                tool = codes.get(frame.f_code)
            if frame.f_code.co_name == _CALL_FRAME:
                msg = frame.f_locals.get("msg")
                call_id = getattr(msg, "call_id", None)
                break
            frame = frame.f_back
        return (tool, call_id) if tool is not None else None

    def _report(self, held_by: tuple[str, str | None], held_s: float) -> None:
        tool, call_id = held_by
        now = time.monotonic()
        if now - self._warned_at.get(tool, -WARN_EVERY_S) < WARN_EVERY_S:
            self._suppressed[tool] = self._suppressed.get(tool, 0) + 1
            return
        self._warned_at[tool] = now
        more = self._suppressed.pop(tool, 0)
        log.warning(
            "asyncio pool: async tool %r (call %s) blocked the event loop for %.2fs%s; every "
            "other call on this worker waited. An `async def` tool must not block: await "
            "asyncio.sleep or an async client instead, or make it a plain `def` so it runs "
            "on the prefork pool",
            tool,
            call_id or "unknown",
            held_s,
            f" (and {more} more time(s) since the last warning)" if more else "",
        )


def code_of(func: object) -> CodeType | None:
    """The code object of a tool's function (through decorators and functools.partial)."""
    target = inspect.unwrap(func)  # type: ignore[arg-type]
    while hasattr(target, "func"):  # functools.partial
        target = target.func
    code = getattr(target, "__code__", None)
    if code is None:
        code = getattr(getattr(type(target), "__call__", None), "__code__", None)  # noqa: B004
    return code if isinstance(code, CodeType) else None
