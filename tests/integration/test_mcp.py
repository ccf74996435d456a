"""``toolfleet mcp``: the mcp package's own client, over stdio and over HTTP, runs
tools on real workers: list tools, a sync, an async, a failing and a secret-argument tool,
denied calls, concurrent calls, cancelling one, one branch per MCP session, a bearer token.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
import redis
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.support.fleet import REPO_ROOT, private_workers
from tests.support.otlp_collector import OtlpCollector, ReceivedSpan
from tests.support.waiting import until, until_async
from toolfleet.adapters.mcp import BRANCH_META_KEY, CALL_META_KEY
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.embedded.processes import free_port
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallResult

SECRET = f"sk-mcp-{uuid.uuid4().hex}"
TOKEN = f"token-{uuid.uuid4().hex}"
GATES = ("tests.support.mcp_gates:no_forbidden_echo", "tests.support.mcp_gates:policy")


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpCollector]:
    """Where the workers and the MCP servers here export their spans."""
    with OtlpCollector() as running:
        yield running


def _otel_env(collector: OtlpCollector) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        # Whatever tracer an earlier test left in this process (one that samples nothing
        # sends "not sampled" trace context), the server and workers record every span.
        "OTEL_TRACES_SAMPLER": "always_on",
    }


@pytest.fixture(scope="module")
def mcp_fleet(
    fleet_settings: Settings, redis_url: str, collector: OtlpCollector
) -> Iterator[dict[str, str]]:
    """A sync and an async worker on queues and a key prefix of their own, exporting spans
    to ``collector``; yields the TOOLFLEET_* environment an MCP server needs to reach them."""
    with private_workers(
        redis_url,
        "mcp",
        concurrency={"sync": 2, "async": 50},
        worker_env=_otel_env(collector),
    ) as env:
        yield env


def _server_env(fleet_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env.update(fleet_env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def _command() -> list[str]:
    script = Path(sys.executable).parent / "toolfleet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "toolfleet.cli"]


def _mcp_args(*extra: str) -> list[str]:
    args = ["mcp", "--tools", "tests.support.sample_tools", "--timeout-s", "60", *extra]
    for gate in GATES:
        args += ["--gate", gate]
    return args


def _text(result: types.CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, types.TextContent)
    return content.text


def _meta(result: types.CallToolResult) -> dict[str, Any]:
    return dict(result.meta or {})


def _record(fleet_env: dict[str, str], call_id: str) -> CallResult | None:
    client = redis.Redis.from_url(fleet_env["TOOLFLEET_BROKER_URL"])
    try:
        raw = client.get(Keys(fleet_env["TOOLFLEET_KEY_PREFIX"]).event(call_id))
    finally:
        client.close()
    return CallResult.model_validate_json(raw) if raw else None


def _started_calls(fleet_env: dict[str, str]) -> list[str]:
    keys = Keys(fleet_env["TOOLFLEET_KEY_PREFIX"])
    client = redis.Redis.from_url(fleet_env["TOOLFLEET_BROKER_URL"])
    try:
        prefix = keys.started("")
        return [k.decode()[len(prefix) :] for k in client.scan_iter(match=keys.started("*"))]
    finally:
        client.close()


def _history(fleet_env: dict[str, str], branch_id: str) -> Branch:
    async def load() -> Branch:
        settings = Settings.from_env(fleet_env)
        fleet = Fleet(settings)
        try:
            return await Branch.load(branch_id, fleet=fleet)
        finally:
            await fleet.aclose()

    return asyncio.run(load())


async def _exercise(client: Client, fleet_env: dict[str, str]) -> dict[str, Any]:
    """The calls both transports must get right; returns what the caller checks afterwards."""
    listed = await client.list_tools()
    tools = {t.name: t for t in listed.tools}
    assert {"add", "sleep_async", "fail", "with_secret"} <= set(tools)
    assert tools["add"].input_schema["properties"]["a"]["type"] == "number"
    assert tools["with_secret"].input_schema["properties"]["api_key"].get("x-toolfleet-secret")

    added = await client.call_tool("add", {"a": 1, "b": 2})  # sync tool, prefork worker
    assert not added.is_error and json.loads(_text(added)) == 3
    branch_id = _meta(added)[BRANCH_META_KEY]
    slept = await client.call_tool("sleep_async", {"seconds": 0.01})  # async tool
    assert not slept.is_error and json.loads(_text(slept)) == 0.01

    failed = await client.call_tool("fail", {"message": "nope"})  # a result, not an MCPError
    assert failed.is_error
    assert _text(failed) == "tool 'fail' failed: ValueError: nope"

    secret = await client.call_tool("with_secret", {"query": "q", "api_key": SECRET})
    assert not secret.is_error

    denied = await client.call_tool("echo", {"value": "forbidden"})  # the session gate
    assert denied.is_error
    assert "denied by the governance gate" in _text(denied) and "did not run" in _text(denied)
    refused = await client.call_tool("returns_none", {})  # a PermissionPolicy as gate
    assert refused.is_error and "denied" in _text(refused)
    unknown = await client.call_tool("no_such_tool", {})
    assert unknown.is_error and "unknown tool 'no_such_tool'" in _text(unknown)
    # Arguments are checked against the schema listed above, before any worker sees them.
    mistyped = await client.call_tool("add", {"a": "x", "b": 1})
    assert mistyped.is_error
    assert "argument 'a' expects float, got 'x'" in _text(mistyped), _text(mistyped)

    # Concurrent calls run side by side on the async worker, each its own call.
    results: list[types.CallToolResult] = []

    async def one(i: int) -> None:
        results.append(await client.call_tool("sleep_async", {"seconds": 0.5}))

    began = time.monotonic()
    async with anyio.create_task_group() as group:
        for i in range(10):
            group.start_soon(one, i)
    elapsed_s = time.monotonic() - began
    assert len(results) == 10 and not any(r.is_error for r in results)
    assert len({_meta(r)[CALL_META_KEY] for r in results}) == 10
    assert elapsed_s < 4.0, f"10 concurrent 0.5 s calls took {elapsed_s:.1f} s"

    # Cancel one: the client abandons the request once the call runs on the worker.
    before = set(_started_calls(fleet_env))
    running: list[str] = []
    with anyio.CancelScope() as scope:

        async def cancel_when_started() -> None:
            def started() -> bool:
                running.extend(set(_started_calls(fleet_env)) - before)
                return bool(running)

            await until_async(started, timeout_s=20, what="the long call to start on a worker")
            scope.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(cancel_when_started)
            await client.call_tool("sleep_async", {"seconds": 30})
            pytest.fail("the call returned although it was cancelled")
    (cancelled_id,) = running
    record = await anyio.to_thread.run_sync(
        lambda: until(
            lambda: _record(fleet_env, cancelled_id), timeout_s=15, what="the cancelled record"
        )
    )
    assert record.status is EventStatus.CANCELLED

    # The session still works after a cancel.
    again = await client.call_tool("add", {"a": 2, "b": 2})
    assert json.loads(_text(again)) == 4 and _meta(again)[BRANCH_META_KEY] == branch_id
    return {
        "branch_id": branch_id,
        "cancelled_id": cancelled_id,
        "calls": 19,
        "add_call_id": _meta(added)[CALL_META_KEY],
    }


def _check_history(fleet_env: dict[str, str], outcome: dict[str, Any]) -> None:
    """The session's calls are one branch's history; the secret is in none of it."""

    def complete() -> Branch | None:
        branch = _history(fleet_env, outcome["branch_id"])
        return branch if len(branch.messages) == 2 * outcome["calls"] else None

    branch = until(complete, timeout_s=15, what="the session's history")
    functions = [m.content.function for m in branch.messages[::2]]
    assert functions.count("sleep_async") == 12 and functions.count("add") == 3
    assert SECRET not in json.dumps([m.model_dump(mode="json") for m in branch.messages])
    responses = {m.content.function: m.content for m in branch.messages[1::2]}
    assert responses["fail"].error == "ValueError: nope"


def test_stdio_client_runs_tools_on_the_fleet(
    mcp_fleet: dict[str, str], collector: OtlpCollector
) -> None:
    command, *prefix = _command()
    params = StdioServerParameters(
        command=command,
        args=[*prefix, *_mcp_args()],
        env={**_server_env(mcp_fleet), **_otel_env(collector)},
        cwd=str(REPO_ROOT),
    )

    async def main() -> dict[str, Any]:
        with anyio.fail_after(120):
            async with Client(params) as client:
                return await _exercise(client, mcp_fleet)

    outcome = anyio.run(main)
    _check_history(mcp_fleet, outcome)

    # One trace per tools/call: the mcp package's server span, then toolfleet's act and call
    # spans in the server, then the worker's span across the broker.
    call_id = outcome["add_call_id"]

    def traced(spans: list[ReceivedSpan]) -> bool:
        return any(
            s.name == "toolfleet.worker add" and s.attributes.get("toolfleet.call_id") == call_id
            for s in spans
        ) and any(s.name == "tools/call add" for s in spans)

    spans = until(lambda: collector.spans_where(traced), timeout_s=20, what=collector.names)
    by_id = {s.span_id: s for s in spans}
    (worker,) = [
        s
        for s in spans
        if s.name == "toolfleet.worker add" and s.attributes.get("toolfleet.call_id") == call_id
    ]
    chain = [worker.name]
    node = worker
    while node.parent_span_id in by_id:
        node = by_id[node.parent_span_id]
        chain.append(node.name)
    expected = ["toolfleet.worker add", "toolfleet.call add", "toolfleet.act", "tools/call add"]
    assert chain == expected
    assert node.service == "toolfleet-mcp" and worker.service == "toolfleet-worker-sync"
    assert all(SECRET not in str(v) for s in spans for v in s.attributes.values())


def test_with_no_broker_url_the_server_runs_the_embedded_default() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    command, *prefix = _command()
    params = StdioServerParameters(
        command=command,
        args=[*prefix, "mcp", "--tools", "tests.support.sample_tools"],
        env=env,
        cwd=str(REPO_ROOT),
    )

    async def main() -> tuple[types.CallToolResult, types.CallToolResult]:
        with anyio.fail_after(120):
            async with Client(params) as client:
                return (
                    await client.call_tool("add", {"a": 20, "b": 22}),
                    await client.call_tool("sleep_async", {"seconds": 0.01}),
                )

    added, slept = anyio.run(main)
    assert not added.is_error and json.loads(_text(added)) == 42
    assert not slept.is_error and json.loads(_text(slept)) == 0.01


@pytest.fixture()
def http_server(mcp_fleet: dict[str, str]) -> Iterator[str]:
    port = free_port()
    env = {**_server_env(mcp_fleet), "TEST_MCP_TOKEN": TOKEN}
    log = open(f"/tmp/toolfleet-mcp-http-{port}.log", "w+b")
    process = subprocess.Popen(
        [
            *_command(),
            *_mcp_args("--transport", "http", "--port", str(port)),
            *("--token-env", "TEST_MCP_TOKEN"),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def listening() -> bool:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"toolfleet mcp exited: {log.read().decode()[-2000:]}")
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        until(listening, timeout_s=30, what="toolfleet mcp to listen")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()
        Path(log.name).unlink(missing_ok=True)


@asynccontextmanager
async def _http_client(url: str, token: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        # The handshake protocol: it has sessions (Mcp-Session-Id), one branch each.
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="legacy") as client:
            yield client


def test_http_client_runs_tools_on_the_fleet_with_a_bearer_token(
    mcp_fleet: dict[str, str], http_server: str
) -> None:
    async def main() -> tuple[dict[str, Any], str]:
        with anyio.fail_after(120):
            async with _http_client(http_server, TOKEN) as client:
                outcome = await _exercise(client, mcp_fleet)
            # A second MCP session gets a branch of its own.
            async with _http_client(http_server, TOKEN) as other:
                result = await other.call_tool("add", {"a": 5, "b": 5})
                return outcome, _meta(result)[BRANCH_META_KEY]

    outcome, other_branch = anyio.run(main)
    assert other_branch != outcome["branch_id"]
    _check_history(mcp_fleet, outcome)


def test_http_refuses_a_client_without_the_token(
    mcp_fleet: dict[str, str], http_server: str
) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        reply = httpx2.post(
            http_server,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={**headers, "Accept": "application/json, text/event-stream"},
            timeout=10,
        )
        assert reply.status_code == 401


def test_without_tool_modules_the_command_says_what_to_pass() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    done = subprocess.run(
        [*_command(), "mcp"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "pass --tools MODULE" in done.stderr


def _listeners(port: int) -> list[str]:
    """The local addresses listening on TCP ``port`` (IPv4 and IPv6), from /proc/net."""
    found: list[str] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.rsplit(":", 1)
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_http_binds_loopback_only_by_default(http_server: str) -> None:
    port = int(http_server.rsplit(":", 1)[1].split("/")[0])
    # 0100007F is 127.0.0.1 in /proc's byte order; 0.0.0.0 or :: would reach every interface.
    assert _listeners(port) == ["0100007F"]


def test_http_on_another_address_without_a_token_warns() -> None:
    # 192.0.2.1 (TEST-NET-1) is not this machine's: the warning comes, then the bind fails,
    # so nothing is ever served beyond loopback by this test.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["TOOLFLEET_BROKER_URL"] = "redis://127.0.0.1:1/0"
    args = [
        "mcp",
        "--tools",
        "tests.support.sample_tools",
        "--transport",
        "http",
        "--host",
        "192.0.2.1",
    ]
    done = subprocess.run(
        [*_command(), *args, "--port", str(free_port())],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "serving on 192.0.2.1 without a bearer token" in done.stderr


def test_the_readmes_desktop_assistant_config_is_a_valid_toolfleet_mcp_command() -> None:
    """The README's claude_desktop_config.json block parses, and its command line is one
    `toolfleet mcp` accepts (stdio, the tools and gate options as documented)."""
    from toolfleet.cli import build_parser

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("```json\n", 1)[1].split("```", 1)[0]
    server = json.loads(block)["mcpServers"]["toolfleet"]
    assert server["command"].endswith("/toolfleet")
    assert "TOOLFLEET_BROKER_URL" in server["env"]
    args = build_parser().parse_args(server["args"])
    assert args.command == "mcp" and args.transport == "stdio"
    assert args.tools == ["mytools"] and args.gate == ["mygates:policy"]
