"""MCP Tasks to the letter of the ext-tasks specification, with a raw JSON-RPC client
(tests/support/mcp_wire.py) against real ``toolfleet mcp --transport http`` processes and real
workers: the result shapes, the error codes, an unknown or expired id, another caller's id, and
a client without the extension, whose answer is the one a server without tasks gives."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import private_workers
from tests.support.mcp_servers import http_replica
from tests.support.mcp_wire import TASKS, WireClient
from tests.support.waiting import until
from toolfleet.schemas.settings import Settings

TOOLS = ("tests.support.sample_tools", "tests.support.task_tools")
TOKEN = f"token-{uuid.uuid4().hex}"
OTHER_TOKEN = f"other-{uuid.uuid4().hex}"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(
    fleet_settings: Settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """On one fleet: a server with tasks, one without, one with another token, one whose
    tasks live a second and whose gate denies echo("forbidden")."""
    logs = tmp_path_factory.mktemp("wire")
    env = {"TEST_TOKEN": TOKEN}
    token = ("--token-env", "TEST_TOKEN")
    with (
        private_workers(
            redis_url, "mcpwire", tools=TOOLS, concurrency={"sync": 2, "async": 10}
        ) as fleet,
        http_replica(fleet, TOOLS, logs / "tasks.log", *token, **env) as (tasks, _),
        http_replica(fleet, TOOLS, logs / "plain.log", *token, "--no-tasks", **env) as (plain, _),
        http_replica(fleet, TOOLS, logs / "other.log", *token, TEST_TOKEN=OTHER_TOKEN) as (
            other,
            _,
        ),
        http_replica(
            fleet,
            TOOLS,
            logs / "short.log",
            *token,
            *("--task-ttl-s", "1", "--gate", "tests.support.mcp_gates:no_forbidden_echo"),
            **env,
        ) as (
            short,
            _,
        ),
    ):
        yield {"tasks": tasks, "plain": plain, "other": other, "short": short}


def _ids_blanked(raw: bytes) -> str:
    """The answer with its call's ids (which differ per call and per server) blanked."""
    text = raw.decode()
    return re.sub(r'("toolfleet/(?:branch_id|call_id)":\s*)"[^"]*"', r'\1"-"', text)


def test_discover_advertises_the_extension(servers: dict[str, str]) -> None:
    answer = WireClient(servers["tasks"], TOKEN).call("server/discover", {})
    assert answer["result"]["capabilities"]["extensions"][TASKS] == {}


def test_a_client_without_the_extension_gets_todays_answer_byte_for_byte(
    servers: dict[str, str],
) -> None:
    """Same call, same bytes from a server offering tasks and one that does not (--no-tasks),
    the call's ids aside; a failing tool too."""
    for name, arguments in (("add", {"a": 2, "b": 3}), ("fail", {"message": "nope"})):
        params = {"name": name, "arguments": arguments}
        with_tasks = WireClient(servers["tasks"], TOKEN, declare_tasks=False).post(
            "tools/call", params, request_id=7
        )
        without = WireClient(servers["plain"], TOKEN, declare_tasks=False).post(
            "tools/call", params, request_id=7
        )
        assert _ids_blanked(with_tasks) == _ids_blanked(without)
        assert b'"task"' not in with_tasks
    result = json.loads(with_tasks)["result"]
    assert result["isError"] is True and result["resultType"] == "complete"


def test_a_declaring_client_gets_a_task_and_its_result_as_the_call_would_have(
    servers: dict[str, str],
) -> None:
    client = WireClient(servers["tasks"], TOKEN)
    created = client.call("tools/call", {"name": "add", "arguments": {"a": 2, "b": 3}})["result"]
    assert created["resultType"] == "task"
    assert created["status"] == "working"
    assert len(created["taskId"]) >= 40
    assert ISO.match(created["createdAt"]) and ISO.match(created["lastUpdatedAt"])
    assert isinstance(created["ttlMs"], int) and created["pollIntervalMs"] > 0
    task_id = created["taskId"]

    def ended() -> dict[str, Any] | None:
        got = client.call("tasks/get", {"taskId": task_id})["result"]
        return got if got["status"] == "completed" else None

    got = until(ended, timeout_s=30, what="the task completed")
    assert got["resultType"] == "complete" and got["taskId"] == task_id
    direct = WireClient(servers["plain"], TOKEN).call(
        "tools/call", {"name": "add", "arguments": {"a": 2, "b": 3}}
    )["result"]
    assert got["result"]["content"] == direct["content"] == [{"type": "text", "text": "5"}]
    assert got["result"]["isError"] is False
    # An update with no outstanding key and a cancel of an ended task: acknowledged, no change.
    update = {"taskId": task_id, "inputResponses": {"nothing": {"action": "accept"}}}
    for method, params in (("tasks/update", update), ("tasks/cancel", {"taskId": task_id})):
        ack = client.call(method, params)["result"]
        assert ack["resultType"] == "complete" and set(ack) <= {"resultType", "_meta"}
    assert client.call("tasks/get", {"taskId": task_id})["result"]["status"] == "completed"


def test_unknown_ids_missing_capability_and_a_wrong_route_are_the_specified_errors(
    servers: dict[str, str],
) -> None:
    client = WireClient(servers["tasks"], TOKEN)
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        params: dict[str, Any] = {"taskId": "no-such-task"}
        if method == "tasks/update":
            params["inputResponses"] = {}
        error = client.call(method, params)["error"]
        assert error["code"] == -32602, (method, error)
        undeclared = WireClient(servers["tasks"], TOKEN, declare_tasks=False)
        error = undeclared.call(method, params)["error"]
        assert error["code"] == -32021, (method, error)
        assert error["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}
    created = client.call("tools/call", {"name": "add", "arguments": {"a": 1, "b": 1}})
    task_id = created["result"]["taskId"]
    error = client.call("tasks/get", {"taskId": task_id}, name="another-task")["error"]
    assert error["code"] == -32020


def test_a_task_is_unknown_to_another_token_and_once_its_ttl_has_passed(
    servers: dict[str, str], tmp_path: Path
) -> None:
    """The server with OTHER_TOKEN shares the fleet's Redis: the id is still unknown to it."""
    mine = WireClient(servers["tasks"], TOKEN)
    created = mine.call("tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}})
    task_id = created["result"]["taskId"]
    theirs = WireClient(servers["other"], OTHER_TOKEN)
    assert theirs.call("tasks/get", {"taskId": task_id})["error"]["code"] == -32602
    assert theirs.call("tasks/cancel", {"taskId": task_id})["error"]["code"] == -32602
    assert "result" in mine.call("tasks/get", {"taskId": task_id})

    short = WireClient(servers["short"], TOKEN)
    gate = tmp_path / "never"
    created = short.call("tools/call", {"name": "slow_steps", "arguments": {"gate": str(gate)}})
    assert created["result"]["ttlMs"] == 1000
    task_id = created["result"]["taskId"]
    started = time.monotonic()
    until(
        lambda: short.call("tasks/get", {"taskId": task_id}).get("error", {}).get("code") == -32602,
        timeout_s=15,
        what="the task expired",
    )
    assert time.monotonic() - started >= 0.5


def test_subscriptions_listen_pushes_each_change_of_the_callers_tasks(
    servers: dict[str, str], tmp_path: Path
) -> None:
    """The stream is acknowledged with the caller's own task ids only, then carries the task's
    progress as statusMessage and its completed state with the result, and ends."""
    client = WireClient(servers["tasks"], TOKEN)
    gate = tmp_path / "gate"
    created = client.call("tools/call", {"name": "slow_steps", "arguments": {"gate": str(gate)}})
    task_id = created["result"]["taskId"]
    not_mine = WireClient(servers["other"], OTHER_TOKEN).call(
        "tools/call", {"name": "add", "arguments": {"a": 1, "b": 1}}
    )["result"]["taskId"]

    def release_after_progress() -> None:
        until(
            lambda: client.call("tasks/get", {"taskId": task_id})["result"].get("statusMessage"),
            timeout_s=30,
            what="progress",
        )
        gate.touch()

    releaser = threading.Thread(target=release_after_progress)
    releaser.start()
    frames = client.frames(
        "subscriptions/listen", {"notifications": {"taskIds": [task_id, not_mine, "unknown"]}}
    )
    releaser.join(timeout=60)
    ack, *pushes, end = frames
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == {"taskIds": [task_id]}
    subscription = ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]
    assert {p["method"] for p in pushes} == {"notifications/tasks"}
    assert all(p["params"]["taskId"] == task_id for p in pushes)
    assert all(
        p["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == subscription
        for p in pushes
    )
    messages = [p["params"].get("statusMessage") for p in pushes]
    assert "3/3: step 3 of 3" in messages
    assert pushes[-1]["params"]["status"] == "completed"
    assert pushes[-1]["params"]["result"]["content"][0]["text"] == "done after 3 steps"
    assert "result" in end


def test_subscriptions_listen_for_tasks_needs_the_extension(servers: dict[str, str]) -> None:
    undeclared = WireClient(servers["tasks"], TOKEN, declare_tasks=False)
    (answer,) = undeclared.frames("subscriptions/listen", {"notifications": {"taskIds": ["x"]}})
    assert answer["error"]["code"] == -32021


def test_an_approval_is_input_required_and_a_decline_is_a_completed_refusal(
    servers: dict[str, str],
) -> None:
    """The parked call's one input request is an elicitation form; an answer to a key that is
    not outstanding is ignored; a decline refuses the call with the default reason."""
    client = WireClient(servers["tasks"], TOKEN)
    created = client.call("tools/call", {"name": "approved_refund", "arguments": {"amount": 5}})
    task_id = created["result"]["taskId"]
    parked = client.call("tasks/get", {"taskId": task_id})["result"]
    assert parked["status"] == "input_required"
    ((key, request),) = parked["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert request["params"]["mode"] == "form"
    assert request["params"]["requestedSchema"]["required"] == ["approve"]
    ignored = {"taskId": task_id, "inputResponses": {"approval-other": {"action": "accept"}}}
    client.call("tasks/update", ignored)
    again = client.call("tasks/get", {"taskId": task_id})["result"]
    assert again["status"] == "input_required" and list(again["inputRequests"]) == [key]
    declined = {"taskId": task_id, "inputResponses": {key: {"action": "decline"}}}
    assert client.call("tasks/update", declined)["result"]["resultType"] == "complete"

    def ended() -> dict[str, Any] | None:
        got = client.call("tasks/get", {"taskId": task_id})["result"]
        return got if got["status"] == "completed" else None

    done = until(ended, timeout_s=30, what="the refusal")
    assert done["result"]["isError"] is True
    assert "declined by the MCP client's user" in done["result"]["content"][0]["text"]


def test_a_call_a_gate_denies_is_answered_at_once_not_as_a_task(servers: dict[str, str]) -> None:
    """Nothing is enqueued, so there is nothing to wait for: the server decides, per request,
    to answer with the plain result (the denial), as the extension allows."""
    client = WireClient(servers["short"], TOKEN)
    denied = client.call("tools/call", {"name": "echo", "arguments": {"value": "forbidden"}})
    assert denied["result"]["resultType"] == "complete"
    assert denied["result"]["isError"] is True
    assert "denied by the governance gate" in denied["result"]["content"][0]["text"]
    allowed = client.call("tools/call", {"name": "echo", "arguments": {"value": "fine"}})
    assert allowed["result"]["resultType"] == "task"
