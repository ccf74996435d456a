"""A stdio ``Transport`` for ``mcp.Client`` that keeps what the server process wrote.

Like the mcp package's own stdio client it runs the server as a child with pipes and speaks
newline-delimited JSON-RPC, but it also keeps every raw stdout line (before and after the
client is done, up to the process's exit), its stderr, and the process itself, so a test can
signal it, read its exit code and check that stdout carried nothing but protocol frames.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

__all__ = ["RecordingStdio", "not_protocol_frames"]


class RecordingStdio:
    """``Client(RecordingStdio(argv, env=..., cwd=...))``: the client enters it, which starts
    the process; leaving the client closes the process's stdin, as a client does, and waits
    for it to exit (a minute at most, then kills it), unless the test stopped it first.
    ``stdout_lines`` and ``stderr()`` stay readable afterwards."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | Path) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.cwd = str(cwd)
        self.stdout_lines: list[bytes] = []
        self._stderr = tempfile.TemporaryFile()
        self._process: anyio.abc.Process | None = None
        self._stdout_closed = anyio.Event()
        self._stack: contextlib.AsyncExitStack | None = None

    @property
    def process(self) -> anyio.abc.Process:
        assert self._process is not None, "the transport was not entered"
        return self._process

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    async def __aenter__(
        self,
    ) -> tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[SessionMessage]]:
        async with contextlib.AsyncExitStack() as stack:
            streams = await stack.enter_async_context(self._running())
            self._stack = stack.pop_all()
        return streams

    async def __aexit__(self, *exc: object) -> None:
        assert self._stack is not None
        await self._stack.aclose()

    async def wait(self, timeout_s: float) -> int:
        """The exit code, once the process has exited and its stdout is read to the end."""
        with anyio.fail_after(timeout_s):
            code = await self.process.wait()
            await self._stdout_closed.wait()
        return code

    async def close_stdin(self) -> None:
        stdin = self.process.stdin
        if stdin is not None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await stdin.aclose()

    @contextlib.asynccontextmanager
    async def _running(
        self,
    ) -> AsyncIterator[
        tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[SessionMessage]]
    ]:
        self._process = await anyio.open_process(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=self.env,
            cwd=self.cwd,
        )
        to_client, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, from_client = anyio.create_memory_object_stream[SessionMessage](0)
        async with anyio.create_task_group() as group:
            group.start_soon(self._read_stdout, to_client)
            group.start_soon(self._write_stdin, from_client)
            try:
                yield read_stream, write_stream
            finally:
                # As a client ends: close the server's stdin, give it time to exit.
                with anyio.CancelScope(shield=True):
                    await self.close_stdin()
                    with anyio.move_on_after(60):
                        await self.process.wait()
                        await self._stdout_closed.wait()
                    if self.process.returncode is None:
                        self.process.kill()
                        await self.process.wait()
                group.cancel_scope.cancel()

    async def _read_stdout(self, to_client: MemoryObjectSendStream[Any]) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        buffer = b""
        client_gone = False
        try:
            async with to_client:
                async for chunk in stdout:
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        self.stdout_lines.append(line)
                        if client_gone:
                            continue  # keep reading: a line written at exit counts too
                        try:
                            item: Any = SessionMessage(
                                types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                            )
                        except Exception as exc:
                            item = exc
                        try:
                            await to_client.send(item)
                        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                            client_gone = True
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            if buffer:
                self.stdout_lines.append(buffer)
            self._stdout_closed.set()

    async def _write_stdin(self, from_client: MemoryObjectReceiveStream[SessionMessage]) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        async with from_client:
            async for message in from_client:
                frame = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                try:
                    await stdin.send(frame.encode() + b"\n")
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return


def not_protocol_frames(lines: Sequence[bytes]) -> list[bytes]:
    """The lines that are not one JSON-RPC message each (empty: stdout was protocol only)."""
    bad = []
    for line in lines:
        try:
            types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except Exception:
            bad.append(line)
    return bad
