"""Where the ADR is silent, toolfleet follows lionagi's semantics (D5): permission
precedence deny > allow > escalate, tools hashable and found in the registry by object or name,
StopHook ending a TOOL_POST/TOOL_ERROR chain without a failure, lionagi Tools registering with
``@tool`` (processors included). The given-ActionRequest rule is checked through real workers in
tests/integration/test_provider_calls.py."""

from __future__ import annotations

import asyncio
import typing
from typing import Any

from lionagi.protocols.action.tool import Tool as LionagiTool

from toolfleet.dispatcher import HookBus, HookPoint, PermissionPolicy, StopHook
from toolfleet.schemas.function_calling import FunctionCalling
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tool import Tool
from toolfleet.workers.registry import Registry, tool


def test_allow_rules_win_over_a_catch_all_escalation() -> None:
    # lionagi's own pattern: escalate everything on bash except what is explicitly allowed.
    policy = PermissionPolicy(
        escalate={"bash": ["*"]}, allow={"bash": ["ls*", "cat *"]}, deny={"bash": ["rm *"]}
    )
    assert policy.check("bash", "ls -la", {}).decision == "allow"
    assert policy.check("bash", "cat notes.txt", {}).decision == "allow"
    assert policy.check("bash", "curl example.org", {}).decision == "escalate"
    # deny still beats allow
    both = PermissionPolicy(allow={"bash": ["*"]}, deny={"bash": ["rm *"]})
    assert both.check("bash", "rm -rf /", {}).decision == "deny"


def test_tools_are_hashable_and_found_by_object_or_name() -> None:
    reg = Registry()

    def add(a: int, b: int) -> int:
        return a + b

    tool(registry=reg, preprocessor_kwargs={"x": 1})(add)
    registered = reg.get("add")
    assert {registered: "ok"}[registered] == "ok"  # hashable despite its kwargs dict
    assert len({registered, reg.get("add")}) == 1
    assert "add" in reg and registered in reg and add in reg
    stranger = Tool(func_callable=lambda a, b: a, function="add")
    assert stranger not in reg and "sub" not in reg and 3 not in reg


def test_stop_hook_ends_post_and_error_chains_without_a_failure() -> None:
    seen: list[str] = []

    def first(payload: dict[str, Any]) -> None:
        seen.append("first")
        raise StopHook

    def second(payload: dict[str, Any]) -> None:
        seen.append("second")

    bus = HookBus()
    for point in (HookPoint.TOOL_POST, HookPoint.TOOL_ERROR):
        bus.on(point, first)
        bus.on(point, second)
    assert asyncio.run(bus.emit(HookPoint.TOOL_POST, {})) == []
    assert asyncio.run(bus.emit(HookPoint.TOOL_ERROR, {})) == []
    assert seen == ["first", "first"]


def test_a_lionagi_tool_registers_with_its_processors() -> None:
    reg = Registry()

    def greet(name: str) -> str:
        """Greet someone."""
        return f"hello {name}"

    # lionagi's schema builder reads evaluated annotations (this module postpones them).
    greet.__annotations__ = typing.get_type_hints(greet)

    def shout(arguments: dict[str, Any], suffix: str = "") -> dict[str, Any]:
        return {"name": arguments["name"].upper() + suffix}

    lionagi_tool = LionagiTool(
        func_callable=greet,
        preprocessor=shout,
        preprocessor_kwargs={"suffix": "!"},
        postprocessor=lambda text: text + ".",
    )
    assert tool(lionagi_tool, registry=reg) is lionagi_tool
    assert lionagi_tool in reg and "greet" in reg
    registered = reg.get("greet")
    assert registered.preprocessor_kwargs == {"suffix": "!"}
    call = FunctionCalling(func_tool=registered, arguments={"name": "ada"})
    asyncio.run(call.invoke())
    assert call.execution.status is EventStatus.COMPLETED
    assert call.response == "hello ADA!."
    assert reg.specs("anthropic")[0]["description"] == "Greet someone."
