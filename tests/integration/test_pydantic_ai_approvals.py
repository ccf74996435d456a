"""Pydantic AI's deferred tools on the fleet: a tool declared ``approval=True`` ends the run
with ``DeferredToolRequests`` as ``requires_approval`` does, and the calls approved in
``DeferredToolResults`` pass toolfleet's approval step and run (recorded); a tool that raises
``ApprovalRequired`` on a worker is deferred and, once approved, runs with
``ctx.tool_call_approved``; with ``approvals="fleet"`` the call waits for ``fleet.approve`` /
``fleet.deny`` instead. Scripted model (``FunctionModel``), real workers and Redis.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDenied

from tests.integration.test_pydantic_ai_fleet import conversation, returns, turns
from tests.support.agent_fleet import AgentFleet, agent_fleet
from tests.support.fleet import run
from tests.support.pydantic_ai_tools import Account
from tests.support.waiting import until_async
from toolfleet import Branch, Fleet
from toolfleet.adapters.pydantic_ai import APPROVED_SUFFIX, FleetToolset
from toolfleet.schemas.settings import Settings


@pytest.fixture(scope="module")
def pa(fleet_settings: Settings, redis_url: str) -> Iterator[AgentFleet]:
    more = ("tests.support.pydantic_ai_tools",)
    with agent_fleet(fleet_settings, redis_url, "pydantic-ai-approve", more_tools=more) as fleet:
        yield fleet


def seen_by_workers(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_an_approval_tool_defers_the_run_and_deferred_results_decide_it(
    pa: AgentFleet, tmp_path: Path
) -> None:
    log = tmp_path / "seen.jsonl"
    deps = Account(owner="alice", log=str(log))
    asking, _ = turns(
        [("approved_transfer", {"amount": 5}, "t1"), ("approved_transfer", {"amount": 900}, "t2")]
    )
    finishing, _ = turns("done")
    conv = conversation()

    async def scenario(fleet: Fleet) -> tuple[Any, Any, list[Any], Branch]:
        toolset = FleetToolset(["approved_transfer"], fleet=fleet)
        output_type: Any = [str, DeferredToolRequests]
        agent = Agent(FunctionModel(asking), toolsets=[toolset], output_type=output_type)
        first = await agent.run("pay", deps=deps, conversation_id=conv)
        waiting = await fleet.approvals()  # nothing was sent, so nothing parked
        decided = DeferredToolResults(approvals={"t1": True, "t2": ToolDenied("over the limit")})
        with agent.override(model=FunctionModel(finishing)):
            second = await agent.run(
                message_history=first.all_messages(),
                deferred_tool_results=decided,
                deps=deps,
                conversation_id=conv,
            )
        branch_id = toolset.branch_id(conv)
        assert branch_id is not None
        return first, second, waiting, await Branch.load(branch_id, fleet=fleet)

    first, second, waiting, stored = run(pa.settings, scenario)
    assert isinstance(first.output, DeferredToolRequests)
    assert [c.tool_call_id for c in first.output.approvals] == ["t1", "t2"]
    assert waiting == []
    assert second.output == "done"
    moved, denied = returns(second.new_messages())
    assert (moved.outcome, moved.content) == ("success", "moved 5 for alice")
    assert (denied.outcome, denied.content) == ("denied", "over the limit")
    # Only the approved call ran, once, knowing it was approved.
    assert [(s["tool_call_id"], s["approved"]) for s in seen_by_workers(log)] == [("t1", True)]
    # toolfleet's record: the call passed its approval step, decided by this toolset.
    [event] = stored.events
    assert event.tool_call_id == f"t1{APPROVED_SUFFIX}"
    assert event.approval is not None and event.approval["decision"] == "approved"
    assert "approve_what_the_run_approved" in str(event.approval["by"])


def test_approval_required_raised_on_a_worker_defers_and_the_approved_call_runs_again(
    pa: AgentFleet, tmp_path: Path
) -> None:
    log = tmp_path / "seen.jsonl"
    deps = Account(owner="carol", log=str(log))
    asking, _ = turns([("guarded_delete", {"path": "/tmp/x"}, "g1")])
    finishing, _ = turns("done")
    conv = conversation()

    async def scenario(fleet: Fleet) -> tuple[Any, Any]:
        toolset = FleetToolset(["guarded_delete"], fleet=fleet)
        output_type: Any = [str, DeferredToolRequests]
        agent = Agent(FunctionModel(asking), toolsets=[toolset], output_type=output_type)
        first = await agent.run("clean", deps=deps, conversation_id=conv)
        with agent.override(model=FunctionModel(finishing)):
            second = await agent.run(
                message_history=first.all_messages(),
                deferred_tool_results=DeferredToolResults(approvals={"g1": True}),
                deps=deps,
                conversation_id=conv,
            )
        return first, second

    first, second = run(pa.settings, scenario)
    assert isinstance(first.output, DeferredToolRequests)
    assert [c.tool_call_id for c in first.output.approvals] == ["g1"]
    [deleted] = returns(second.new_messages())
    assert (deleted.outcome, deleted.content) == ("success", "deleted /tmp/x")
    assert [(s["tool_call_id"], s["approved"]) for s in seen_by_workers(log)] == [
        ("g1", False),
        ("g1", True),
    ]


def test_with_fleet_approvals_the_call_waits_for_fleet_approve_or_deny(
    pa: AgentFleet, tmp_path: Path
) -> None:
    log = tmp_path / "seen.jsonl"
    deps = Account(owner="dan", log=str(log))
    model, _ = turns(
        [("approved_transfer", {"amount": 7}, "f1"), ("approved_transfer", {"amount": 70}, "f2")],
        "done",
    )

    async def scenario(fleet: Fleet) -> Any:
        toolset = FleetToolset(["approved_transfer"], fleet=fleet, approvals="fleet")
        agent = Agent(FunctionModel(model), toolsets=[toolset])
        running = asyncio.ensure_future(agent.run("pay", deps=deps))

        async def both_parked() -> list[Any]:
            waiting = [r for r in await fleet.approvals() if r.tool == "approved_transfer"]
            return waiting if len(waiting) == 2 else []

        parked = await until_async(
            both_parked, timeout_s=15, what="both calls parked", while_running=running
        )
        by_id = {r.tool_call_id: r.call_id for r in parked}
        await fleet.approve(by_id["f1"], by="alice")
        await fleet.deny(by_id["f2"], "too much", by="bob")
        return await asyncio.wait_for(running, 15)

    result = run(pa.settings, scenario)
    approved, denied = returns(result.all_messages())
    assert (approved.outcome, approved.content) == ("success", "moved 7 for dan")
    assert denied.outcome == "denied"
    assert denied.content == "call of tool 'approved_transfer' was not run: denied by bob: too much"
    assert [s["tool_call_id"] for s in seen_by_workers(log)] == ["f1"]
