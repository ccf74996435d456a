"""Two agent frameworks' own MCP clients run the fleet's tools through ``toolfleet mcp``:
Microsoft Agent Framework (``MCPStreamableHTTPTool``) and Strands Agents (``MCPClient``), each
with a scripted model, against a real HTTP server and real workers. The tool appends a line to
a file, so the test sees that a worker ran it, once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, MCPStreamableHTTPTool
from strands import Agent as StrandsAgent
from strands.tools.mcp import MCPClient

from tests.support.fleet import private_workers
from tests.support.framework_models import ScriptedAgentFrameworkClient, ScriptedStrandsModel
from tests.support.mcp_servers import http_replica
from toolfleet.schemas.settings import Settings

TOOLS = ("tests.support.sample_tools",)
TOKEN = f"token-{uuid.uuid4().hex}"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server_url(
    fleet_settings: Settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    log = tmp_path_factory.mktemp("frameworks") / "mcp.log"
    with (
        private_workers(redis_url, "mcpfw", tools=TOOLS, concurrency={"sync": 1}) as fleet,
        http_replica(fleet, TOOLS, log, "--token-env", "TEST_TOKEN", TEST_TOKEN=TOKEN) as (
            url,
            _,
        ),
    ):
        yield url


def test_microsoft_agent_framework_runs_a_fleet_tool(server_url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.txt"
    model = ScriptedAgentFrameworkClient({"path": str(side), "text": "agent framework"})

    async def main() -> Any:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with MCPStreamableHTTPTool(
            name="fleet", url=server_url, static_headers=headers
        ) as tools:
            return await Agent(client=model, name="scripted", tools=tools).run("write it")

    answer = asyncio.run(main())
    assert answer.text == "the file has 1 line(s)"
    assert side.read_text() == "agent framework\n"
    assert {"add", "append_line", "echo"} <= set(model.offered)


def test_strands_agents_runs_a_fleet_tool(server_url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.txt"
    model = ScriptedStrandsModel({"path": str(side), "text": "strands"})
    client = MCPClient(url=server_url, headers={"Authorization": f"Bearer {TOKEN}"})
    with client:
        agent = StrandsAgent(model=model, tools=client.list_tools_sync(), callback_handler=None)
        answer = agent("write it")
    assert str(answer).strip() == "the file has 1 line(s)"
    assert side.read_text() == "strands\n"
    assert {"add", "append_line", "echo"} <= set(model.offered)
