"""``toolfleet mcp`` as a process: how it stops, what it writes to stdout, who it lets in.

A real server process with real workers, driven by the mcp package's own ``Client``: over stdio
through a transport that also keeps the process's raw stdout (tests/support/mcp_stdio.py), over
streamable HTTP with ``streamable_http_client``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.fleet import REPO_ROOT, private_workers
from tests.support.mcp_stdio import RecordingStdio, not_protocol_frames
from tests.support.waiting import until
from toolfleet.embedded.processes import free_port
from toolfleet.schemas.settings import Settings

TOOLS = ("tests.support.sample_tools", "tests.support.mcp_tools")
TOKEN = f"token-{uuid.uuid4().hex}"
STOPPED = "toolfleet mcp: stopped by SIGTERM; the fleet's clients are closed"


@pytest.fixture(scope="module")
def mcp_fleet(fleet_settings: Settings, redis_url: str) -> Iterator[dict[str, str]]:
    """A sync and an async worker on queues and a key prefix of their own; yields the
    TOOLFLEET_* environment an MCP server needs to reach them."""
    with private_workers(
        redis_url, "mcpproc", tools=TOOLS, concurrency={"sync": 2, "async": 20}
    ) as env:
        yield env


def _server_env(fleet_env: dict[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFLEET_", "OTEL_"))}
    env.update(fleet_env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _argv(*extra: str) -> list[str]:
    script = Path(sys.executable).parent / "toolfleet"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "toolfleet.cli"]
    tools = [arg for module in TOOLS for arg in ("--tools", module)]
    return [*command, "mcp", *tools, "--timeout-s", "60", *extra]


def _text(result: types.CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, types.TextContent)
    return content.text


# A console span exporter whose batch waits a minute: the spans are still buffered when the
# server stops, so they are written by the final flush at exit, after the protocol is done.
# Sampled whatever the client sends: this test process's client may pass a non-sampled parent.
CONSOLE_TRACES = {
    "OTEL_TRACES_EXPORTER": "console",
    "OTEL_BSP_SCHEDULE_DELAY": "60000",
    "OTEL_TRACES_SAMPLER": "always_on",
}


def test_stdio_stdout_carries_only_protocol_frames_through_exit(
    mcp_fleet: dict[str, str],
) -> None:
    transport = RecordingStdio(_argv(), env=_server_env(mcp_fleet, **CONSOLE_TRACES), cwd=REPO_ROOT)

    async def main() -> tuple[int, list[bytes], str]:
        with anyio.fail_after(120):
            async with Client(transport) as client:
                assert {t.name for t in (await client.list_tools()).tools} >= {"add", "fail"}
                added = await client.call_tool("add", {"a": 1, "b": 2})
                assert not added.is_error and json.loads(_text(added)) == 3
                failed = await client.call_tool("fail", {"message": "nope"})
                assert failed.is_error
            # The client is done and closed the server's stdin: the server exits.
            code = await transport.wait(60)
            return code, transport.stdout_lines, transport.stderr()

    code, lines, stderr = anyio.run(main)
    assert code == 0, stderr
    assert lines, "the server wrote no protocol frame"
    assert not_protocol_frames(lines) == [], stderr
    # What must not be on stdout went to stderr: a tool module's print at import, and the
    # console exporter's spans, flushed at exit.
    assert "tests.support.mcp_tools imported" in stderr
    assert '"name": "toolfleet.act"' in stderr
    assert '"name": "toolfleet.call add"' in stderr


def test_sigterm_stops_a_stdio_server_with_exit_code_0(mcp_fleet: dict[str, str]) -> None:
    transport = RecordingStdio(_argv(), env=_server_env(mcp_fleet, **CONSOLE_TRACES), cwd=REPO_ROOT)

    async def main() -> tuple[int, list[bytes], str]:
        with anyio.fail_after(120):
            async with Client(transport) as client:
                added = await client.call_tool("add", {"a": 2, "b": 3})
                assert json.loads(_text(added)) == 5
                # As docker or systemd stops it: the client still connected, stdin open.
                transport.process.send_signal(signal.SIGTERM)
                code = await transport.wait(30)
            return code, transport.stdout_lines, transport.stderr()

    code, lines, stderr = anyio.run(main)
    assert code == 0, stderr
    assert STOPPED in stderr
    assert not_protocol_frames(lines) == [], stderr
    assert '"name": "toolfleet.call add"' in stderr  # the last spans, flushed at exit


@pytest.fixture()
def http_server(
    mcp_fleet: dict[str, str], tmp_path: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """A ``toolfleet mcp --transport http`` process requiring TOKEN: (url, process, log)."""
    port = free_port()
    log_path = tmp_path / "mcp-http.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*_argv("--transport", "http", "--port", str(port)), "--token-env", "TEST_TOKEN"],
            cwd=REPO_ROOT,
            env=_server_env(mcp_fleet, TEST_TOKEN=TOKEN),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def listening() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"toolfleet mcp exited: {log_path.read_text()[-2000:]}")
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        until(listening, timeout_s=30, what="toolfleet mcp to listen")
        yield f"http://127.0.0.1:{port}/mcp", process, log_path
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


@asynccontextmanager
async def _http_client(url: str, authorization: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": authorization}, timeout=60) as http:
        # The handshake protocol: a session, with its GET stream open while connected.
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            yield client


def test_sigterm_stops_an_http_server_with_exit_code_0(
    http_server: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    url, process, log_path = http_server

    async def main() -> int | None:
        with anyio.fail_after(60):
            async with _http_client(url, f"Bearer {TOKEN}") as client:
                added = await client.call_tool("add", {"a": 4, "b": 5})
                assert json.loads(_text(added)) == 9
                process.send_signal(signal.SIGTERM)  # while the session is open
                return await anyio.to_thread.run_sync(lambda: process.wait(30))

    try:
        code = anyio.run(main)
    except Exception:
        # Leaving the session may fail once the server is gone; the exit code still counts.
        code = process.wait(30)
    log = log_path.read_text()
    assert code == 0, log
    assert STOPPED in log


def test_http_takes_the_bearer_scheme_in_any_case(
    http_server: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    url, _, _ = http_server

    async def main() -> list[Any]:
        outputs = []
        with anyio.fail_after(60):
            for scheme in ("bearer", "BEARER", "Bearer"):
                async with _http_client(url, f"{scheme} {TOKEN}") as client:
                    result = await client.call_tool("add", {"a": 1, "b": 1})
                    outputs.append(json.loads(_text(result)))
        return outputs

    assert anyio.run(main) == [2, 2, 2]
    # The scheme is case-insensitive; the token is not, and another scheme is refused.
    for authorization in (f"bearer {TOKEN.upper()}", f"Basic {TOKEN}", TOKEN):
        reply = httpx2.post(
            url,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={
                "Authorization": authorization,
                "Accept": "application/json, text/event-stream",
            },
            timeout=10,
        )
        assert reply.status_code == 401, authorization
