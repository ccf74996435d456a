"""With real workers: no hook payload carries a raw secret — the context
included — and a call to a tool the dispatcher has not imported shows its non-secret argument
values only when the fleet's workers announced that tool and its secret arguments."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support.fleet import WorkerProcess, call, run
from toolfleet.dispatcher import Branch, Fleet, HookPoint
from toolfleet.schemas.messages import ActionRequest, ActionRequestContent
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.workers.registry import Registry

MARKER = f"sk-hook-{uuid.uuid4().hex}"


def _deep_text(value: Any) -> str:
    """Everything a handler could read from a payload: reprs, and each exception's text."""
    parts = [repr(value)]
    if isinstance(value, dict):
        parts += [_deep_text(v) for v in value.values()]
    if isinstance(value, BaseException):
        parts.append(str(value))
    return "\n".join(parts)


@pytest.mark.slow
def test_no_hook_payload_carries_a_raw_secret(
    fleet_settings: Settings, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    settings = fleet_settings.model_copy(update={"tools": ("tests.support.sample_tools",)})
    seen: list[tuple[str, dict[str, Any]]] = []
    requests: list[Any] = [
        call("with_secret", query="runs", api_key=MARKER),
        # The caller's own ActionRequest travels in the context as `request`.
        ActionRequest(
            content=ActionRequestContent(
                function="with_secret", arguments={"query": "req", "api_key": MARKER}
            )
        ),
        # Refused by the contract: TOOL_ERROR fires with the refusal.
        call("with_secret", query="\ud800", api_key=MARKER),
    ]

    async def scenario(fleet: Fleet) -> list[Any]:
        branch = Branch(fleet=fleet)
        for point in (HookPoint.TOOL_PRE, HookPoint.TOOL_POST, HookPoint.TOOL_ERROR):
            branch.hooks.on(point, lambda p, point=point: seen.append((str(point), p)))
        return list(await branch.act(requests))

    results = run(settings, scenario)
    assert [r.status for r in results[:2]] == [EventStatus.COMPLETED] * 2
    assert results[0].output == {"query": "runs", "api_key_length": len(MARKER)}
    assert results[2].status is EventStatus.ABORTED
    points = [point for point, _ in seen]
    assert points.count(str(HookPoint.TOOL_PRE)) == 3  # the contract is checked after TOOL_PRE
    assert str(HookPoint.TOOL_ERROR) in points
    for point, payload in seen:
        assert MARKER not in _deep_text(payload), f"{point} payload leaks the secret"
        context = payload.get("context")
        if context is not None:
            assert context.arguments["api_key"] == "***"
            assert context.arguments["query"] in ("runs", "req", "\ud800")
            if context.request is not None:
                assert context.request.content.arguments["api_key"] == "***"


@pytest.mark.slow
def test_a_tool_the_dispatcher_lacks_shows_what_the_workers_announced(
    fleet_settings: Settings, sync_worker: WorkerProcess, async_worker: WorkerProcess
) -> None:
    # A dispatcher that imported no tool module; the workers run tests.support.sample_tools and
    # announced each tool's secret arguments when they started.
    bare = fleet_settings.model_copy(update={"tools": ()})

    async def scenario(fleet: Fleet) -> list[Any]:
        branch = Branch(fleet=fleet)
        results = list(
            await branch.act(
                [
                    call("add", a=1, b=2),
                    call("with_secret", query="q", api_key=MARKER),
                    call("nobody_has_this_tool", x=1),
                ],
                suppress_errors=True,
            )
        )
        loaded = await Branch.load(branch.id, fleet=fleet)
        return [results, loaded]

    async def in_fleet(fleet: Fleet) -> list[Any]:
        return await scenario(fleet)

    results, loaded = _run_bare(bare, in_fleet)
    assert [r.status for r in results] == [EventStatus.ABORTED] * 3
    assert all(r.error and r.error.startswith("UnknownToolError") for r in results)
    shown = [r.arguments for r in results]
    assert shown == [{"a": 1, "b": 2}, {"query": "q", "api_key": "***"}, {"x": "***"}]
    stored = [m.content.arguments for m in loaded.messages if m.role == "action_request"]
    assert stored == shown
    assert MARKER not in repr(loaded.messages) + repr(loaded.events)


def _run_bare(settings: Settings, scenario: Any) -> Any:
    import asyncio

    async def main() -> Any:
        fleet = Fleet(settings, registry=Registry())
        try:
            return await asyncio.wait_for(scenario(fleet), 60)
        finally:
            await fleet.aclose()

    return asyncio.run(main())
