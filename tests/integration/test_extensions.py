"""The extension protocol (docs/api.md, "Extending a batch") against real workers.

One ``Extension`` registered with ``session.use``, ``branch.use`` and ``fleet.use`` sees
every point of a call's life, in order and with its payload; the older registration calls
share each point's order with it; a failing method is isolated, logged and signalled, and
``on_signal`` hears each signal.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.support.fleet import call, run
from toolfleet import (
    ApprovalRequest,
    Branch,
    CallbackFailed,
    CallProgress,
    Escalate,
    EventRecord,
    EventStatus,
    Extension,
    Fleet,
    HookPoint,
    Session,
    ToolInvocation,
)
from toolfleet.dispatcher.govern.session_signals import Signal
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.messages import ActionRequest, ActionResponse, Message
from toolfleet.schemas.settings import Settings

pytestmark = pytest.mark.usefixtures("sync_worker", "async_worker")


class Watcher(Extension):
    """Logs each hook it receives as (hook, the call's id or tool, what it received)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def authorize(self, invocation: ToolInvocation) -> Any:
        self.seen.append(("authorize", invocation.function, invocation))
        # Every call of count_async waits for an approval, which on_approval gives.
        return Escalate("counting needs a yes") if invocation.function == "count_async" else True

    async def before_call(self, payload: dict[str, Any]) -> None:
        self.seen.append(("before_call", payload["call_id"], payload))
        if payload["context"].arguments.get("value") == "refuse":
            raise PermissionError("not this one")

    def on_approval(self, request: ApprovalRequest) -> bool:
        self.seen.append(("on_approval", request.call_id, request))
        return True

    async def on_progress(self, progress: CallProgress) -> None:
        self.seen.append(("on_progress", progress.call_id, progress))

    def after_call(self, payload: dict[str, Any]) -> None:
        self.seen.append(("after_call", payload["call_id"], payload))

    def call_failed(self, payload: dict[str, Any]) -> None:
        self.seen.append(("call_failed", payload["call_id"], payload))

    async def on_event(self, record: EventRecord) -> None:
        self.seen.append(("on_event", record.call_id or "", record))

    def on_message(self, message: Message) -> None:
        self.seen.append(("on_message", str(message.content.call_id), message))

    def on_signal(self, signal: Signal) -> None:
        self.seen.append(("on_signal", str(getattr(signal, "call_id", "")), signal))

    def of(self, call_id: str | None, function: str) -> list[tuple[str, Any]]:
        return [(hook, got) for hook, key, got in self.seen if key in (call_id, function)]


def test_an_extension_receives_every_hook_of_a_call_in_order_with_its_payload(
    fleet_settings: Settings,
) -> None:
    watcher = Watcher()

    def older(label: str) -> Any:
        return lambda payload: watcher.seen.append((label, payload["call_id"], payload))

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        session = Session(fleet)
        branch = session.new_branch()
        # The older calls and use() share one order per point.
        branch.hooks.on(HookPoint.TOOL_POST, older("hooks.on before use"))
        branch.use(watcher)
        branch.hooks.on(HookPoint.TOOL_POST, older("hooks.on after use"))
        session.use(watcher)
        fleet.use(watcher)
        results = await branch.act(
            [call("count_async", n=2, delay_s=0.15), call("echo", value="refuse")]
        )
        return branch, results

    branch, (counted, refused) = run(fleet_settings, scenario)
    assert counted.status is EventStatus.COMPLETED and counted.output == 2
    assert refused.status is EventStatus.ABORTED
    assert not branch.signals

    seen = watcher.of(counted.call_id, "count_async")
    assert [hook for hook, _ in seen] == [
        "authorize",
        "before_call",
        "on_approval",
        "on_progress",
        "on_progress",
        "hooks.on before use",
        "after_call",
        "hooks.on after use",
        "on_event",
        "on_message",
        "on_message",
    ]
    got = dict(seen)  # the last of each hook
    assert got["authorize"].arguments == {"n": 2, "delay_s": 0.15}
    assert got["authorize"].branch_id == branch.id
    before = got["before_call"]
    assert before["point"] is HookPoint.TOOL_PRE and before["tool_name"] == "count_async"
    assert before["branch_id"] == branch.id
    assert got["on_approval"].reason == "counting needs a yes"
    assert [p.done for h, p in seen if h == "on_progress"] == [1, 2]
    after = got["after_call"]
    assert after["point"] is HookPoint.TOOL_POST and after["status"] is EventStatus.COMPLETED
    assert after["error"] is None
    assert got["on_event"].function == "count_async"
    messages = [m for h, m in seen if h == "on_message"]
    assert isinstance(messages[0], ActionRequest) and isinstance(messages[1], ActionResponse)

    seen = watcher.of(refused.call_id, "echo")
    assert [hook for hook, _ in seen] == [
        "authorize",
        "before_call",
        "call_failed",
        "on_event",
        "on_message",
        "on_message",
    ]
    failed = dict(seen)["call_failed"]
    assert failed["point"] is HookPoint.TOOL_ERROR
    assert isinstance(failed["error"], PermissionError)
    assert dict(seen)["on_event"].execution["status"] == "aborted"


class Broken(Extension):
    """Raises from every hook that is isolated (not authorize nor before_call)."""

    def after_call(self, payload: dict[str, Any]) -> None:
        raise KeyError("post")

    async def on_event(self, record: EventRecord) -> None:
        raise ValueError("event")

    def on_message(self, message: Message) -> None:
        raise RuntimeError("message")

    async def on_progress(self, progress: CallProgress) -> None:
        raise LookupError("progress")


def test_a_failing_extension_method_is_isolated_logged_and_signalled(
    fleet_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    later = Watcher()

    async def scenario(fleet: Fleet) -> tuple[Session, Branch, ActionResponseModel]:
        session = Session(fleet)
        branch = session.new_branch()
        for extension in (Broken(), later):
            branch.use(extension)
            session.use(extension)
        (result,) = await branch.act([call("count_sync", n=2, delay_s=0.15)])
        return session, branch, result

    with caplog.at_level(logging.WARNING, logger="toolfleet"):
        session, branch, result = run(fleet_settings, scenario)
    assert result.status is EventStatus.COMPLETED and result.output == 2
    # The extension registered after the broken one still heard everything.
    assert [h for h, _ in later.of(result.call_id, "count_sync")].count("on_progress") == 2
    assert "after_call" in [h for h, _ in later.of(result.call_id, "count_sync")]
    failed = [s for s in branch.signals if isinstance(s, CallbackFailed)]
    assert session.signals == branch.signals
    assert sorted({(s.where, s.handler) for s in failed}) == [
        ("observer", "Broken.on_event"),
        ("on_message", "Broken.on_message"),
        ("on_progress", "Broken.on_progress"),
        ("tool_post", "Broken.after_call"),
    ]
    assert {s.call_id for s in failed} == {result.call_id}
    # on_signal heard each signal the session recorded, in order.
    assert [got for hook, _, got in later.seen if hook == "on_signal"] == session.signals
    assert "KeyError: 'post'" in {s.error for s in failed}
    logged = [r.getMessage() for r in caplog.records if "Broken." in r.getMessage()]
    assert any("Broken.after_call failed" in line and "KeyError" in line for line in logged)
    assert len(logged) == len(failed)
