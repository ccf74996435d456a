"""The Agents SDK's ``needs_approval`` on the fleet: the SDK's own interruption and approval
flow (``RunResult.interruptions``, ``RunState.approve``/``reject``, resume) works as with its
own executor, and with ``on_fleet(..., fleet_approvals=True)`` the interrupted calls are also
parked in toolfleet's approvals, decided there and applied by ``fleet_decisions``. Scripted
model (the SDK's ``ScriptedModel``), real workers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, Runner
from agents.testing import ScriptedModel

from tests.support import openai_agents_tools as tools
from tests.support.openai_agents_support import (
    RUN,
    call_outputs,
    calls_turn,
    parity_workers,
    scripted,
    sdk_tool,
)
from toolfleet.adapters.openai_agents import binding_of, fleet_decisions, on_fleet
from toolfleet.adapters.openai_agents_approvals import approval_id
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.govern.approvals import load_approval
from toolfleet.schemas.settings import Settings

SECRET = "ADMIN_SECRET"


@pytest.fixture(scope="module")
def settings(redis_url: str) -> Iterator[Settings]:
    with parity_workers(redis_url, "sdk-approvals") as found:
        yield found


def test_needs_approval_interrupts_the_run_and_resumes_through_the_sdks_approval_flow(
    settings: Settings,
) -> None:
    """The SDK decides before the invoker runs: an approved call goes to the fleet when the
    run resumes, a rejected one is never sent, and the model reads the SDK's texts."""

    def script() -> ScriptedModel:
        return scripted(
            calls_turn([("shout", {"text": "yes"}, "c1"), ("shout", {"text": "no"}, "c2")])
        )

    async def run(fleet: Fleet | None) -> tuple[list[str], dict[str, str], list[int]]:
        model = script()
        agent = Agent(name="probe", model=model, tools=[sdk_tool(tools.shout, needs_approval=True)])
        if fleet is not None:
            on_fleet(agent, branch=Branch(fleet=fleet))
        first = await Runner.run(agent, "Go.", run_config=RUN)
        waiting = [item.raw_item.call_id for item in first.interruptions]  # type: ignore[union-attr]
        state = first.to_state()
        for item in first.interruptions:
            if item.raw_item.call_id == "c1":  # type: ignore[union-attr]
                state.approve(item)
            else:
                state.reject(item)
        await Runner.run(agent, state, run_config=RUN)
        assert model.last_call is not None
        binding = binding_of(agent)
        sizes = list(binding.batch_sizes) if binding is not None else []
        return waiting, call_outputs(model.last_call.input), sizes

    async def scenario() -> Any:
        local = await run(None)
        async with Fleet(settings) as fleet:
            return local, await run(fleet)

    (local_waiting, local_read, _), (waiting, read, sizes) = asyncio.run(
        asyncio.wait_for(scenario(), 60)
    )
    assert local_waiting == waiting == ["c1", "c2"]
    assert local_read["c1"] == "YES"
    assert read == local_read
    assert sizes == [1]  # the approved call only


def test_with_fleet_approvals_a_needs_approval_call_parks_in_toolfleet_and_resumes_the_sdks_way(
    settings: Settings,
) -> None:
    """``fleet_approvals=True``: the interrupted calls are listed by toolfleet (named arguments
    only), decided there, and fleet_decisions applies the decisions to the SDK's RunState; a
    call approved in the RunState directly is recorded approved in toolfleet when it runs."""
    model = scripted(
        calls_turn(
            [("shout", {"text": "yes", "ctx": SECRET}, "c1"), ("shout", {"text": "no"}, "c2")]
        ),
        calls_turn([("shout", {"text": "direct"}, "c3")]),
    )

    async def scenario() -> tuple[list[Any], list[dict[str, str]], list[int], Any]:
        async with Fleet(settings) as fleet:
            agent = Agent(
                name="probe", model=model, tools=[sdk_tool(tools.shout, needs_approval=True)]
            )
            on_fleet(agent, fleet=fleet, fleet_approvals=True)
            binding = binding_of(agent)
            assert binding is not None
            first = await Runner.run(agent, "Go.", run_config=RUN)
            listed = [r for r in await fleet.approvals() if r.branch_id == binding.branch.id]
            by_call = {r.tool_call_id: r.call_id for r in listed}
            await fleet.approve(by_call["c1"], by="alice")
            await fleet.deny(by_call["c2"], "not today", by="bob")
            second = await Runner.run(agent, await fleet_decisions(first), run_config=RUN)
            assert model.last_call is not None
            reads = [call_outputs(model.last_call.input)]
            # The next turn's call, approved in the SDK's RunState directly.
            state = second.to_state()
            [item] = second.interruptions
            state.approve(item)
            await Runner.run(agent, state, run_config=RUN)
            reads.append(call_outputs(model.last_call.input))
            [direct] = [r for r in await fleet.approvals() if r.tool_call_id == "c3"] or [None]
            record = await load_approval(fleet.redis, fleet.keys, approval_id(binding, "c3"))
            assert direct is None and record is not None
            return listed, reads, list(binding.batch_sizes), record

    listed, reads, sizes, record = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert sorted(r.tool_call_id for r in listed) == ["c1", "c2"]
    assert {r.tool_call_id: r.arguments for r in listed}["c1"] == {"text": "yes"}
    assert all(SECRET not in json.dumps(r.arguments) for r in listed)
    assert reads[0]["c1"] == "YES" and "denied by bob: not today" in reads[0]["c2"]
    assert reads[1]["c3"] == "DIRECT"
    assert record.approved and record.decided_by == "the Agents SDK's RunState"
    assert sizes == [1, 1]  # the approved calls; the denied one was never sent
