"""Approvals parked in Redis, with real workers, real Redis and the real command line.

The tools (tests/support/approval_tools.py) write a side channel file per run, so "not run"
and "ran once" are counted from what the tools did. Decisions come from a second process
(``toolfleet approvals`` / ``approve`` / ``deny``), from the library and from handlers.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from tests.support.approvals import parked, ran, refund
from tests.support.cli_support import cli_env, toolfleet, toolfleet_argv
from tests.support.fleet import REPO_ROOT, private_workers, run
from tests.support.waiting import until_async
from toolfleet import (
    ApprovalError,
    ApprovalRequest,
    Branch,
    CallbackFailed,
    CallParams,
    EventStatus,
    Extension,
    Fleet,
    PermissionPolicy,
    Session,
)
from toolfleet.dispatcher.history.history import load_records
from toolfleet.schemas.settings import Settings

TOOLS = ("tests.support.approval_tools",)


@pytest.fixture(scope="module")
def approvals(redis_url: str) -> Iterator[tuple[Settings, dict[str, str]]]:
    """Settings (and their environment) of a sync and an async worker for this module."""
    with private_workers(redis_url, "approvals", tools=TOOLS) as env:
        yield Settings.from_env(env, tools=TOOLS), env


async def cli(env: dict[str, str], home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``toolfleet ARGS`` in another process (a second terminal) while act() waits here."""
    return await asyncio.to_thread(toolfleet, *args, home=home, env=env, timeout_s=60)


async def listed(env: dict[str, str], home: Path) -> list[dict[str, Any]]:
    done = await cli(env, home, "approvals", "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_a_parked_call_holds_no_worker_and_is_approved_from_a_second_terminal(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    settings, env = approvals
    side = tmp_path / "side"
    lookup = {"function": "free_lookup", "arguments": {"side": str(side), "token": 2}}

    async def scenario(fleet: Fleet) -> None:
        branch = Branch(fleet=fleet)
        batch = [refund(side, 1, card="4111-1111-1111-1111"), lookup]
        acting = asyncio.create_task(branch.act(batch))
        shown = await until_async(lambda: listed(env, tmp_path), timeout_s=30, what="a listing")
        [waiting] = shown
        assert waiting["tool"] == "refund" and waiting["branch_id"] == branch.id
        assert waiting["arguments"]["card"] != "4111-1111-1111-1111"  # secret: never shown
        assert waiting["arguments"]["amount"] == 5 and waiting["age_s"] >= 0
        # The batch's other call went on; the parked one is on no queue and ran nowhere.
        await until_async(lambda: ("free_lookup", 2) in ran(side), timeout_s=20)
        assert ("refund", 1) not in ran(side)
        assert await fleet.redis.llen(settings.queue_for("sync")) == 0
        assert not acting.done()
        # toolfleet status counts it, and says where to look.
        status = await cli(env, tmp_path, "status", "--json", "--timeout", "0.3")
        assert json.loads(status.stdout)["awaiting_approval"]["count"] == 1, status.stderr
        shown = await cli(env, tmp_path, "status", "--timeout", "0.3")
        assert "calls awaiting approval: 1" in shown.stdout

        approved = await cli(env, tmp_path, "approve", waiting["call_id"], "--by", "alice")
        assert approved.returncode == 0, approved.stderr
        assert "approved by alice" in approved.stdout
        results = await asyncio.wait_for(acting, 30)
        assert [r.output for r in results] == ["refunded 5", "looked up 2"]

        again = await cli(env, tmp_path, "approve", waiting["call_id"])
        assert again.returncode == 1
        assert "already approved by alice" in again.stderr
        _, events = await load_records(fleet.redis, fleet.keys, branch.id)
        decision = next(e.approval for e in events if e.function == "refund")
        assert decision is not None
        assert decision["decision"] == "approved" and decision["by"] == "alice"
        assert decision["at"] is not None and "approval=True" in decision["asked_because"]

    run(settings, scenario, timeout_s=90)
    assert sorted(ran(side)) == [("free_lookup", 2), ("refund", 1)]  # each exactly once


def test_a_denied_call_is_not_run_and_the_model_reads_who_and_why(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    settings, env = approvals
    side = tmp_path / "side"

    async def scenario(fleet: Fleet) -> None:
        branch = Branch(fleet=fleet)
        acting = asyncio.create_task(branch.act([refund(side, 1, amount=900)]))
        [waiting] = await parked(fleet)
        unreasoned = await cli(env, tmp_path, "deny", waiting.call_id)
        assert unreasoned.returncode == 2 and "--reason" in unreasoned.stderr
        denied = await cli(
            env, tmp_path, "deny", waiting.call_id, "--reason", "over 100 needs a manager",
            "--by", "bob",
        )  # fmt: skip
        assert denied.returncode == 0, denied.stderr
        [result] = await asyncio.wait_for(acting, 30)
        assert result.status is EventStatus.SKIPPED
        assert result.output["error"] == (
            "call of tool 'refund' was not run: denied by bob: over 100 needs a manager"
        )
        _, events = await load_records(fleet.redis, fleet.keys, branch.id)
        [event] = events
        assert event.status is EventStatus.SKIPPED
        assert event.approval is not None and event.approval["decision"] == "denied"
        assert event.approval["reason"] == "over 100 needs a manager"
        assert await fleet.approvals() == []

    run(settings, scenario, timeout_s=60)
    assert ran(side) == []


def test_an_undecided_call_ends_denied_at_its_approval_timeout_or_the_batch_deadline(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    settings, _ = approvals
    side = tmp_path / "side"

    async def scenario(fleet: Fleet) -> None:
        branch = Branch(fleet=fleet)
        [timed_out] = await branch.act(
            [refund(side, 1)], call_params=CallParams(approval_timeout_s=0.5)
        )
        [past_deadline] = await branch.act(
            [refund(side, 2)], call_params=CallParams(approval_timeout_s=600, deadline_s=0.5)
        )
        for result in (timed_out, past_deadline):
            assert result.status is EventStatus.SKIPPED
            assert "no one approved it within its approval time" in result.output["error"]
        with pytest.raises(ApprovalError, match="already expired by timeout"):
            await fleet.approve(timed_out.call_id)
        with pytest.raises(ApprovalError, match="no call 'nope' is waiting for approval"):
            await fleet.approve("nope")
        with pytest.raises(ValueError, match="deny\\(\\) needs a reason"):
            await fleet.deny(past_deadline.call_id, " ")

    run(settings, scenario, timeout_s=60)
    assert ran(side) == []


@pytest.mark.parametrize("seam", ["gate", "pre_hook"])
def test_a_policy_escalation_with_no_on_escalate_parks_the_call_until_approved(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path, seam: str
) -> None:
    settings, _ = approvals
    side = tmp_path / "side"
    policy = PermissionPolicy(escalate={"shell": ["sudo *"]})
    seen: list[Any] = []

    async def scenario(fleet: Fleet) -> None:
        session = Session(fleet)
        branch = session.new_branch()
        if seam == "gate":
            session.gate(policy.as_gate())
        else:
            policy.install(branch)
            branch.hooks.on("tool_pre", lambda payload: seen.append(payload.get("approval")))
        calls = [
            {"function": "shell", "arguments": {"side": str(side), "token": t, "action": a}}
            for t, a in ((1, "sudo reboot"), (2, "ls"))
        ]
        acting = asyncio.create_task(branch.act(calls))
        [waiting] = await parked(fleet)
        assert waiting.tool == "shell" and "sudo *" in waiting.reason
        await fleet.approve(waiting.call_id, by="ops")
        results = await asyncio.wait_for(acting, 30)
        assert [r.output for r in results] == ["ran sudo reboot", "ran ls"]

    run(settings, scenario, timeout_s=60)
    assert sorted(ran(side)) == [("shell", 1), ("shell", 2)]
    if seam == "pre_hook":
        # The hooks judged the escalated call again after its approval, and saw it.
        assert any(a is not None and a["decision"] == "approved" for a in seen)


def test_handlers_decide_in_process_none_leaves_the_call_to_others_and_replays_keep_it(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    settings, _ = approvals
    side = tmp_path / "side"
    asked: list[int] = []

    def small_only(request: ApprovalRequest) -> bool | None:
        asked.append(request.arguments["amount"])
        amount = request.arguments["amount"]
        return None if amount == 50 else amount < 100

    async def scenario(fleet: Fleet) -> None:
        fleet.on_approval(lambda request: 1 / 0)  # a raising handler is skipped
        fleet.on_approval(small_only)
        branch = Branch(fleet=fleet)
        calls = [
            {**refund(side, 1, amount=10), "tool_call_id": "call_small"},
            refund(side, 2, amount=500),
            refund(side, 3, amount=50),
        ]
        acting = asyncio.create_task(branch.act(calls))
        [left] = await parked(fleet, where=lambda request: request.arguments["amount"] == 50)
        await fleet.deny(left.call_id, "not today")
        small, large, undecided = await asyncio.wait_for(acting, 30)
        assert small.output == "refunded 10"
        assert large.output["error"].startswith("call of tool 'refund' was not run: denied by ")
        assert "handler small_only" in large.output["error"]
        assert undecided.output["error"].endswith("not today")

        # The model replays call_small on the branch: the decision stands, nothing is asked
        # and nothing runs again (C7).
        [replayed] = await branch.act(
            [{**refund(side, 1, amount=10), "tool_call_id": "call_small"}]
        )
        assert replayed.output == "refunded 10"

    run(settings, scenario, timeout_s=60)
    assert sorted(asked) == [10, 50, 500]
    assert ran(side) == [("refund", 1)]


def test_a_failing_approval_handler_is_logged_and_signalled_and_the_next_is_asked(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An approval handler goes through the one emitter: its failure is a CallbackFailed
    signal of the branch whose call it was, besides the log line (docs/api.md)."""
    settings, _ = approvals
    side = tmp_path / "side"

    class Approver(Extension):
        def on_approval(self, request: ApprovalRequest) -> bool:
            return True

    async def scenario(fleet: Fleet) -> tuple[Branch, str | None]:
        fleet.on_approval(lambda request: 1 / 0)  # type: ignore[arg-type,return-value]
        fleet.use(Approver())
        branch = Branch(fleet=fleet)
        [result] = await asyncio.wait_for(branch.act([refund(side, 1, amount=10)]), 30)
        assert result.output == "refunded 10"  # the next handler approved it
        return branch, result.call_id

    with caplog.at_level("WARNING", logger="toolfleet"):
        branch, call_id = run(settings, scenario, timeout_s=60)
    [failed] = [s for s in branch.signals if isinstance(s, CallbackFailed)]
    assert (failed.call_id, failed.where) == (call_id, "approval")
    assert failed.handler.endswith("<lambda>")
    assert failed.error == "ZeroDivisionError: division by zero"
    assert any(
        "approval" in r.getMessage() and "ZeroDivisionError" in r.getMessage()
        for r in caplog.records
    )


def test_a_handler_that_returns_a_string_decides_nothing_and_one_can_deny_with_its_reason(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A truthy "no" must not approve; a handler gives the model its reason through deny()."""
    settings, _ = approvals
    side = tmp_path / "side"

    async def scenario(fleet: Fleet) -> None:
        fleet.on_approval(lambda request: "no, too large")  # type: ignore[arg-type,return-value]

        async def over_limit(request: ApprovalRequest) -> None:
            if request.arguments["amount"] > 100:
                await fleet.deny(request.call_id, "refunds over 100 need a manager")

        fleet.on_approval(over_limit)
        branch = Branch(fleet=fleet)
        acting = asyncio.create_task(
            branch.act([refund(side, 1, amount=10), refund(side, 2, amount=500)])
        )
        # The string decided nothing: the small refund still waits, for a person here.
        [left] = await parked(fleet, where=lambda request: request.arguments["amount"] == 10)
        await fleet.approve(left.call_id)
        small, large = await asyncio.wait_for(acting, 30)
        assert small.output == "refunded 10"
        assert large.status is EventStatus.SKIPPED
        assert large.output["error"].endswith("refunds over 100 need a manager")

    with caplog.at_level("WARNING", logger="toolfleet"):
        run(settings, scenario, timeout_s=60)
    assert ran(side) == [("refund", 1)]
    warnings = [r.getMessage() for r in caplog.records if "decides nothing" in r.getMessage()]
    assert len(warnings) == 2  # once per parked call
    assert "'no, too large'" in warnings[0] and "return True to approve" in warnings[0]


def test_on_escalate_keeps_the_in_process_semantics_and_parks_nothing(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    settings, _ = approvals
    side = tmp_path / "side"
    policy = PermissionPolicy(
        escalate={"shell": ["sudo *"]}, on_escalate=lambda tool, action, args: action == "sudo ok"
    )

    async def scenario(fleet: Fleet) -> None:
        session = Session(fleet)
        session.gate(policy.as_gate())
        branch = session.new_branch()
        calls = [
            {"function": "shell", "arguments": {"side": str(side), "token": t, "action": a}}
            for t, a in ((1, "sudo ok"), (2, "sudo no"))
        ]
        allowed, refused = await asyncio.wait_for(branch.act(calls), 30)
        assert allowed.output == "ran sudo ok"
        assert refused.status is EventStatus.SKIPPED  # the gate's denial (D2)
        assert await fleet.redis.zcard(fleet.keys.approvals()) == 0

    run(settings, scenario, timeout_s=60)
    assert ran(side) == [("shell", 1)]


def test_approve_and_deny_name_the_call_when_it_is_not_waiting(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    _, env = approvals
    for args in (("approve", "no-such-call"), ("deny", "no-such-call", "--reason", "no")):
        done = toolfleet(*args, home=tmp_path, env=env)
        assert done.returncode == 1
        assert "no call 'no-such-call' is waiting for approval" in done.stderr
        assert "`toolfleet approvals` lists" in done.stderr
    empty = toolfleet("approvals", home=tmp_path, env=env)
    assert empty.returncode == 0 and "no call is waiting for approval" in empty.stdout


def test_over_mcp_a_parked_call_returns_once_it_is_decided(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    """``toolfleet mcp`` over stdio (the mcp package's client): tools/call of an approval tool
    waits, and returns when a second terminal approves it; a denial returns its reason."""
    _, env = approvals
    side = tmp_path / "side"
    argv = toolfleet_argv("mcp", "--tools", TOOLS[0])
    params = StdioServerParameters(
        command=argv[0], args=argv[1:], env=cli_env(tmp_path, env), cwd=str(REPO_ROOT)
    )

    async def decide_next(verb: str, *extra: str) -> None:
        [waiting] = await until_async(lambda: listed(env, tmp_path), timeout_s=30)
        done = await cli(env, tmp_path, verb, waiting["call_id"], *extra)
        assert done.returncode == 0, done.stderr

    async def main() -> list[types.CallToolResult]:
        results: list[types.CallToolResult] = []
        with anyio.fail_after(90):
            async with Client(params) as client:
                for token, verb, extra in ((1, "approve", ()), (2, "deny", ("--reason", "no"))):
                    async with anyio.create_task_group() as group:
                        group.start_soon(decide_next, verb, *extra)
                        arguments = {"side": str(side), "token": token, "amount": 5}
                        results.append(await client.call_tool("refund", arguments))
        return results

    approved, denied = anyio.run(main)
    assert not approved.is_error
    assert "refunded 5" in json.dumps(approved.model_dump(mode="json"))
    assert "was not run: denied by" in json.dumps(denied.model_dump(mode="json"))
    assert ran(side) == [("refund", 1)]


def test_a_cancelled_act_withdraws_its_parked_call(
    approvals: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    """C9 with a call parked: act() is cancelled, the call is recorded CANCELLED, and it leaves
    the approvals list, so no one is asked to decide a call nothing waits for."""
    settings, _ = approvals
    side = tmp_path / "side"

    async def scenario(fleet: Fleet) -> None:
        branch = Branch(fleet=fleet)
        acting = asyncio.create_task(branch.act([refund(side, 1)]))
        [waiting] = await parked(fleet)
        acting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await acting
        assert await fleet.approvals() == []
        with pytest.raises(ApprovalError, match="already expired by cancel"):
            await fleet.approve(waiting.call_id)
        _, events = await load_records(fleet.redis, fleet.keys, branch.id)
        assert [e.status for e in events] == [EventStatus.CANCELLED]

    run(settings, scenario, timeout_s=60)
    assert ran(side) == []
