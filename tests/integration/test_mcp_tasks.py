"""MCP Tasks on the fleet, with FastMCP's own client (``fastmcp`` + ``fastmcp-tasks``): a call
becomes a task, polled to its end on another ``toolfleet mcp`` replica, approved through
``input_required``, its progress read as ``statusMessage``, cancelled; the creating replica
SIGKILLed midway loses nothing. Real workers, real Redis, real server processes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastmcp_tasks
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from tests.support.fleet import private_workers
from tests.support.mcp_servers import cli_command, http_replica, server_env
from tests.support.waiting import until_async
from toolfleet.schemas.settings import Settings

TOOLS = ("tests.support.sample_tools", "tests.support.task_tools")
TOKEN = f"token-{uuid.uuid4().hex}"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tasks_fleet(fleet_settings: Settings, redis_url: str) -> Iterator[dict[str, str]]:
    with private_workers(
        redis_url, "mcptasks", tools=TOOLS, concurrency={"sync": 2, "async": 20}
    ) as env:
        yield env


@pytest.fixture(scope="module")
def replicas(
    tasks_fleet: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[tuple[str, Any]]]:
    """Two HTTP replicas of one fleet, the same token, no sticky routing between them."""
    logs = tmp_path_factory.mktemp("replicas")
    token_env = {"TEST_TOKEN": TOKEN}
    with (
        http_replica(
            tasks_fleet, TOOLS, logs / "a.log", "--token-env", "TEST_TOKEN", **token_env
        ) as first,
        http_replica(
            tasks_fleet, TOOLS, logs / "b.log", "--token-env", "TEST_TOKEN", **token_env
        ) as second,
    ):
        yield [first, second]


def _client(url: str, **kwargs: Any) -> Client[Any]:
    return Client(url, auth=TOKEN, timeout=60, **kwargs)


def test_a_task_created_on_one_replica_is_polled_to_its_result_on_the_other(
    replicas: list[tuple[str, Any]], tmp_path: Path
) -> None:
    (url_a, _), (url_b, _) = replicas
    gate = tmp_path / "gate"

    async def main() -> tuple[Any, Any, Any]:
        async with _client(url_a) as a, _client(url_b) as b:
            task = await fastmcp_tasks.call_tool_task(
                a, "slow_steps", {"gate": str(gate), "steps": 3}
            )
            on_b = fastmcp_tasks.ToolTask(b, "slow_steps", task.create_result)

            async def progressed() -> Any:
                status = await on_b.status()
                return status if status.status_message == "3/3: step 3 of 3" else None

            working = await until_async(progressed, timeout_s=30, what="progress on replica b")
            gate.touch()
            done = await on_b.wait(timeout=30)
            return task.create_result, working, done

    created, working, done = asyncio.run(main())
    assert created.status == "working" and created.result_type == "task"
    assert len(created.task_id) >= 40  # 256 random bits, URL-safe
    assert working.status == "working"
    assert done.status == "completed"
    assert done.result["content"][0]["text"] == "done after 3 steps"
    assert done.result["isError"] is False


def test_a_tool_error_is_a_completed_task_with_is_error(
    replicas: list[tuple[str, Any]],
) -> None:
    (url_a, _), _ = replicas

    async def main() -> Any:
        async with _client(url_a) as a:
            task = await fastmcp_tasks.call_tool_task(a, "failing_tool", {"why": "no disk"})
            return await task.wait(timeout=30)

    done = asyncio.run(main())
    assert done.status == "completed"
    assert done.result["isError"] is True
    assert "no disk" in done.result["content"][0]["text"]


def test_call_tool_drives_the_task_and_approves_through_elicitation(
    replicas: list[tuple[str, Any]],
) -> None:
    (url_a, _), _ = replicas
    asked: list[str] = []

    async def approve(message: str, response_type: Any, params: Any, context: Any) -> Any:
        asked.append(message)
        return {"approve": True, "reason": "fine"}

    async def main() -> Any:
        async with _client(url_a, elicitation_handler=approve) as a:
            return await a.call_tool("approved_refund", {"amount": 7})

    result = asyncio.run(main())
    assert result.content[0].text == "refunded 7"
    assert len(asked) == 1 and "approved_refund" in asked[0]


def test_sigkill_of_the_creating_replica_loses_nothing(
    tasks_fleet: dict[str, str], replicas: list[tuple[str, Any]], tmp_path: Path
) -> None:
    """Created on a replica of its own, which is SIGKILLed while the call waits for approval:
    FastMCP's client, now on the other replica, sees input_required and approves through its
    elicitation handler; that replica enqueues the call and reports its progress and result."""
    (url_b, _) = replicas[1]
    gate = tmp_path / "gate"
    asked: list[str] = []

    async def approve(message: str, response_type: Any, params: Any, context: Any) -> Any:
        asked.append(message)
        return {"approve": True}

    async def main(url_c: str, process: Any) -> tuple[Any, Any, Any, Any]:
        async with _client(url_c) as c:
            task = await fastmcp_tasks.call_tool_task(c, "approved_steps", {"gate": str(gate)})
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        async with _client(url_b, elicitation_handler=approve) as b:
            on_b = fastmcp_tasks.ToolTask(b, "approved_steps", task.create_result)
            parked = await on_b.wait(state="input_required", timeout=30)
            driven = asyncio.ensure_future(on_b.result())  # answers, then polls to the end

            async def progressed() -> Any:
                status = await on_b.status()
                return status if status.status_message == "3/3: step 3 of 3" else None

            working = await until_async(
                progressed, timeout_s=45, what="progress after the takeover", while_running=driven
            )
            gate.touch()
            result = await asyncio.wait_for(driven, 30)
            return task.create_result, parked, working, result

    token_env = {"TEST_TOKEN": TOKEN}
    with http_replica(
        tasks_fleet, TOOLS, tmp_path / "c.log", "--token-env", "TEST_TOKEN", **token_env
    ) as (url_c, process):
        created, parked, working, result = asyncio.run(main(url_c, process))
    assert process.returncode == -signal.SIGKILL
    assert created.status == "working"
    assert parked.status == "input_required"
    (request,) = parked.input_requests.values()
    assert request["method"] == "elicitation/create"
    assert len(asked) == 1 and "approved_steps" in asked[0]
    assert working.status == "working"
    assert result.content[0].text == "done after 3 steps"


def test_cancel_ends_a_running_task_as_cancelled_and_is_idempotent(
    replicas: list[tuple[str, Any]], tmp_path: Path
) -> None:
    (url_a, _), (url_b, _) = replicas
    gate = tmp_path / "never"

    async def main() -> Any:
        async with _client(url_a) as a, _client(url_b) as b:
            task = await fastmcp_tasks.call_tool_task(a, "slow_steps", {"gate": str(gate)})
            on_b = fastmcp_tasks.ToolTask(b, "slow_steps", task.create_result)

            async def running() -> bool:
                return (await on_b.status()).status_message is not None

            await until_async(running, timeout_s=30, what="the call running")
            await on_b.cancel()
            await on_b.cancel()
            return await task.wait(timeout=40)

    done = asyncio.run(main())
    assert done.status == "cancelled"


def test_a_denial_through_input_required_is_the_model_readable_refusal(
    replicas: list[tuple[str, Any]],
) -> None:
    (url_a, _), _ = replicas

    async def deny(message: str, response_type: Any, params: Any, context: Any) -> Any:
        return {"approve": False, "reason": "refunds need a ticket"}

    async def main() -> Any:
        async with _client(url_a, elicitation_handler=deny) as a:
            return await a.call_tool("approved_refund", {"amount": 7}, raise_on_error=False)

    result = asyncio.run(main())
    assert result.is_error
    assert "refunds need a ticket" in result.content[0].text


def test_toolfleet_approve_decides_a_task_waiting_in_input_required(
    tasks_fleet: dict[str, str], replicas: list[tuple[str, Any]]
) -> None:
    """The command line still decides a call whose task waits: the task goes on to its end."""
    (url_a, _), _ = replicas

    async def main() -> tuple[Any, Any]:
        async with _client(url_a) as a:
            task = await fastmcp_tasks.call_tool_task(a, "approved_refund", {"amount": 3})
            parked = await task.wait(state="input_required", timeout=30)
            (key,) = parked.input_requests
            call_id = key.removeprefix("approval-")
            approved = await asyncio.to_thread(
                subprocess.run,
                [*cli_command(), "approve", call_id, "--by", "ops"],
                env=server_env(tasks_fleet),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert approved.returncode == 0, approved.stderr
            return parked, await task.wait(timeout=30)

    parked, done = asyncio.run(main())
    assert parked.status == "input_required"
    assert done.status == "completed"
    assert done.result["content"][0]["text"] == "refunded 3"


def test_cancel_after_the_creating_replica_died_records_the_call_cancelled(
    tasks_fleet: dict[str, str], replicas: list[tuple[str, Any]], tmp_path: Path
) -> None:
    """No act() is left to cancel: the replica asked records the call CANCELLED (C9) and the
    async call is cancelled on its worker."""
    (url_b, _) = replicas[1]
    gate = tmp_path / "never"

    async def main(url_c: str, process: Any) -> Any:
        async with _client(url_c) as c:
            task = await fastmcp_tasks.call_tool_task(c, "slow_steps", {"gate": str(gate)})

            async def running() -> bool:
                return (await task.status()).status_message is not None

            await until_async(running, timeout_s=30, what="the call running")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        async with _client(url_b) as b:
            on_b = fastmcp_tasks.ToolTask(b, "slow_steps", task.create_result)
            await on_b.cancel()
            await on_b.cancel()
            # Within the dead replica's heartbeat TTL (4 s) and a poll.
            return await on_b.wait(timeout=45)

    token_env = {"TEST_TOKEN": TOKEN}
    with http_replica(
        tasks_fleet, TOOLS, tmp_path / "c.log", "--token-env", "TEST_TOKEN", **token_env
    ) as (url_c, process):
        done = asyncio.run(main(url_c, process))
    assert done.status == "cancelled"


def test_a_task_created_over_stdio_is_answered_by_another_stdio_server(
    tasks_fleet: dict[str, str], tmp_path: Path
) -> None:
    """Two desktop-style stdio servers of one fleet: a task one created (no credentials: the
    stdio owner) is polled to its result through the other."""
    gate = tmp_path / "gate"
    (command, *rest) = cli_command()
    args = [*rest, "mcp", *[a for m in TOOLS for a in ("--tools", m)]]

    def stdio() -> Client[Any]:
        transport = StdioTransport(command, args, env=server_env(tasks_fleet))
        return Client(transport, timeout=60)

    async def main() -> tuple[Any, Any]:
        async with stdio() as first, stdio() as second:
            task = await fastmcp_tasks.call_tool_task(first, "slow_steps", {"gate": str(gate)})
            on_second = fastmcp_tasks.ToolTask(second, "slow_steps", task.create_result)
            working = await on_second.status()
            gate.touch()
            return working, await on_second.wait(timeout=30)

    working, done = asyncio.run(main())
    assert working.status == "working"
    assert done.status == "completed"
    assert done.result["content"][0]["text"] == "done after 3 steps"


def test_sigterm_cancels_the_calls_of_the_tasks_a_replica_runs(
    tasks_fleet: dict[str, str], replicas: list[tuple[str, Any]], tmp_path: Path
) -> None:
    """A graceful stop treats a task's call as it treats a synchronous one: cancelled (C9), and
    the task, read on another replica, says so; the server exits 0."""
    (url_b, _) = replicas[1]
    gate = tmp_path / "never"

    async def main(url_c: str, process: Any) -> Any:
        async with _client(url_c) as c:
            task = await fastmcp_tasks.call_tool_task(c, "slow_steps", {"gate": str(gate)})

            async def running() -> bool:
                return (await task.status()).status_message is not None

            await until_async(running, timeout_s=30, what="the call running")
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 60) == 0
        async with _client(url_b) as b:
            return await fastmcp_tasks.ToolTask(b, "slow_steps", task.create_result).wait(
                timeout=30
            )

    token_env = {"TEST_TOKEN": TOKEN}
    with http_replica(
        tasks_fleet, TOOLS, tmp_path / "c.log", "--token-env", "TEST_TOKEN", **token_env
    ) as (url_c, process):
        done = asyncio.run(main(url_c, process))
    assert done.status == "cancelled"
