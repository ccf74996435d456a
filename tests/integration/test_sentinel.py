"""A fleet behind Redis Sentinel, with real processes: a primary, a replica, three sentinels,
``toolfleet worker`` processes and a dispatcher all given only the sentinels' URL and the
primary's name. ``toolfleet status`` shows each sentinel's view of the primary, and each way
to get the setting wrong is one line naming what is missing. ``history``, ``recover``,
``approvals`` and ``mcp`` reach the fleet through the sentinels too. (A failover mid-batch:
tests/chaos/test_chaos_sentinel_failover.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from tests.support.cli_support import cli_env, toolfleet, toolfleet_argv
from tests.support.fleet import REPO_ROOT, WorkerProcess, assert_linked_pairs, start_worker
from tests.support.sentinel_cluster import MASTER, SentinelCluster
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

TOOLS = ("tests.support.sample_tools",)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SentinelCluster]:
    started = SentinelCluster()
    try:
        yield started.start()
    finally:
        started.stop()


def _env(cluster: SentinelCluster, master: str = MASTER) -> dict[str, str]:
    return {"TOOLFLEET_BROKER_URL": cluster.url, "TOOLFLEET_SENTINEL_MASTER": master}


def test_a_worker_and_a_dispatcher_work_end_to_end_through_a_sentinel_url(
    cluster: SentinelCluster, tmp_path: Path
) -> None:
    env = {"TOOLFLEET_SENTINEL_MASTER": MASTER}
    workers: list[WorkerProcess] = []
    try:
        workers.append(start_worker("sync", redis_url=cluster.url, env=env, concurrency=2))
        workers.append(start_worker("async", redis_url=cluster.url, env=env, concurrency=20))
        settings = Settings(broker_url=cluster.url, sentinel_master=MASTER, tools=TOOLS)
        requests = [
            {"function": "add", "arguments": {"a": 1, "b": 2}},
            {"function": "sleep_async", "arguments": {"seconds": 0.05}},
        ]

        async def scenario() -> tuple[str, list[object], Branch]:
            async with Fleet(settings) as fleet:
                branch = Branch(fleet=fleet)
                results = await asyncio.wait_for(branch.act(requests), 60)
                stored = await Branch.load(branch.id, fleet=fleet)
                return branch.id, list(results), stored

        branch_id, results, stored = asyncio.run(scenario())
        assert [r.status for r in results] == [EventStatus.COMPLETED] * 2  # type: ignore[attr-defined]
        assert [r.output for r in results] == [3, 0.05]  # type: ignore[attr-defined]
        assert_linked_pairs(stored, results)  # type: ignore[arg-type]
        # The records and history are on the primary the sentinels name.
        primary = cluster.primary().client()
        assert primary.llen(f"toolfleet:history:{branch_id}") == 4
        # The command line reads the same history through the sentinels.
        shown = toolfleet("history", branch_id, "--json", home=tmp_path, env=_env(cluster))
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.count('"call_id"') >= 2
        # So do recover (nothing left open: it read the journals), approvals and mcp.
        recovered = toolfleet("recover", branch_id, "--json", home=tmp_path, env=_env(cluster))
        assert recovered.returncode == 1 and "no open batch" in recovered.stderr
        waiting = toolfleet("approvals", "--json", home=tmp_path, env=_env(cluster))
        assert waiting.returncode == 0 and waiting.stdout == "", waiting.stderr
        assert _mcp_add(cluster, tmp_path) == "3"
    finally:
        for worker in workers:
            worker.stop(timeout_s=10)


def _mcp_add(cluster: SentinelCluster, home: Path) -> str:
    """``toolfleet mcp`` over stdio through the sentinels: the text of one ``add`` call."""
    argv = toolfleet_argv("mcp", "--tools", TOOLS[0])
    params = StdioServerParameters(
        command=argv[0], args=argv[1:], env=cli_env(home, _env(cluster)), cwd=str(REPO_ROOT)
    )

    async def main() -> str:
        with anyio.fail_after(60):
            async with Client(params) as client:
                result = await client.call_tool("add", {"a": 1, "b": 2})
        assert not result.is_error
        [content] = result.content
        assert isinstance(content, types.TextContent)
        return content.text

    return anyio.run(main)


def test_status_shows_each_sentinels_view_of_the_primary(
    cluster: SentinelCluster, tmp_path: Path
) -> None:
    env = _env(cluster)
    as_json = toolfleet("status", "--json", "--timeout", "0.3", home=tmp_path, env=env)
    assert as_json.returncode == 0, as_json.stderr
    topology = json.loads(as_json.stdout)["topology"]
    primary = f"127.0.0.1:{cluster.primary_port()}"
    assert topology["role"] == "primary" and len(topology["replicas"]) == 1
    views = topology["sentinels"]
    assert [v["sentinel"] for v in views] == [f"127.0.0.1:{s.port}" for s in cluster.sentinels]
    for view in views:
        assert view["primary"] == primary
        assert view["quorum"] == 2
        assert view["sentinels"] == 3
        assert view["replicas"] == 1
        assert view["flags"] == "master"
    table = toolfleet("status", "--timeout", "0.3", home=tmp_path, env={**env, "COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "sentinels" in table.stdout and "quorum" in table.stdout
    assert table.stdout.count(primary) >= 3


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_each_sentinel_configuration_error_names_what_is_missing(
    cluster: SentinelCluster, tmp_path: Path
) -> None:
    # No primary name: refused when the settings are read, on every command.
    for args in (("status",), ("worker", "--kind", "sync", "--tools", TOOLS[0])):
        proc = toolfleet(*args, home=tmp_path, env={"TOOLFLEET_BROKER_URL": cluster.url})
        assert proc.returncode == 2, proc.stderr
        line = _one_line(proc.stderr)
        assert "TOOLFLEET_SENTINEL_MASTER is unset" in line
        assert "TOOLFLEET_SENTINEL_MASTER=mymaster" in line
    with pytest.raises(ValueError, match="TOOLFLEET_SENTINEL_MASTER is unset"):
        Settings(broker_url=cluster.url)  # pydantic's ValidationError, a ValueError

    # Malformed Sentinel URLs: the part that is wrong, and how to write one.
    malformed = {
        f"{cluster.url};redis://127.0.0.1:6379": "got redis:// in part 4",
        "sentinel://:26379": "part 1 names no host",
        "sentinel://127.0.0.1:notaport": "part 1 is not a valid URL",
        "sentinel://127.0.0.1:26379/zero": "db 'zero' is not a number",
    }
    for url, expected in malformed.items():
        proc = toolfleet(
            "status",
            home=tmp_path,
            env={"TOOLFLEET_BROKER_URL": url, "TOOLFLEET_SENTINEL_MASTER": MASTER},
        )
        assert proc.returncode == 2, proc.stderr
        line = _one_line(proc.stderr)
        assert expected in line and "TOOLFLEET_BROKER_URL" in line, line
        assert "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380" in line, line

    # A primary name the sentinels do not monitor: the worker, status and a dispatcher say so.
    wrong = _env(cluster, master="not-the-primary")
    for args in (("status",), ("worker", "--kind", "sync", "--tools", TOOLS[0])):
        proc = toolfleet(*args, home=tmp_path, env=wrong, timeout_s=60)
        assert proc.returncode == 2, proc.stderr
        line = _one_line(proc.stderr)
        assert "monitor no primary named 'not-the-primary'" in line, line
        assert f"they monitor: {MASTER}" in line and "TOOLFLEET_SENTINEL_MASTER" in line

    async def act_with_wrong_name() -> None:
        settings = Settings(broker_url=cluster.url, sentinel_master="not-the-primary")
        async with Fleet(settings) as fleet:
            await Branch(fleet=fleet).act([{"function": "add", "arguments": {"a": 1, "b": 2}}])

    with pytest.raises(ConfigurationError, match="monitor no primary named 'not-the-primary'"):
        asyncio.run(act_with_wrong_name())
