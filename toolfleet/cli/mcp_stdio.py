"""The stdio transport of ``toolfleet mcp``: the protocol keeps stdin and stdout to itself."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, cast

__all__ = ["ProtocolStdio", "claim_stdio"]


@dataclass
class ProtocolStdio:
    """The protocol's private copies of the process's stdin and stdout."""

    stdin_fd: int
    stdout_fd: int

    def streams(self) -> tuple[Any, Any]:
        """(stdin, stdout) for ``mcp.server.stdio.stdio_server``."""
        import io

        import anyio

        out = io.TextIOWrapper(
            os.fdopen(self.stdout_fd, "wb", closefd=False), encoding="utf-8", newline="\n"
        )
        return cast(Any, _StdinLines(self.stdin_fd)), anyio.wrap_file(out)


def claim_stdio() -> ProtocolStdio | None:
    """Keep stdin and stdout for the MCP protocol alone, for the rest of the process.

    The protocol gets private duplicates of fds 0 and 1; then fd 1 points at stderr and fd 0
    at /dev/null, so whatever else writes to stdout (a print in a tool module, a console span
    exporter, its final flush at exit, a child process) lands on stderr, and nothing else
    reads the client's input. The mcp package's stdio_server diverts them only while it
    serves and gives fd 1 back on its exit, before the last spans are flushed.
    """
    sys.stdout.flush()
    try:
        stdin_fd, stdout_fd = os.dup(0), os.dup(1)  # not inherited by children
    except OSError:
        return None  # no stdin or stdout to keep: stdio_server's own handling
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return ProtocolStdio(stdin_fd, stdout_fd)


class _StdinLines:
    """The client's lines, read by a daemon thread: a stop never waits on a blocked read (an
    anyio worker thread would, and would then hold the interpreter's exit too)."""

    def __init__(self, fd: int) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def pump() -> None:
            def put(line: str | None) -> None:
                with contextlib.suppress(RuntimeError):  # the loop has closed: we are exiting
                    loop.call_soon_threadsafe(self._queue.put_nowait, line)

            try:
                with os.fdopen(fd, "rb", closefd=False) as raw:
                    for line in raw:
                        put(line.decode("utf-8", errors="replace"))
            except (OSError, ValueError):
                pass
            put(None)

        threading.Thread(target=pump, name="toolfleet-mcp-stdin", daemon=True).start()

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        line = await self._queue.get()
        if line is None:
            raise StopAsyncIteration
        return line
