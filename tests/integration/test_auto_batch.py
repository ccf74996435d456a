"""CallParams(bundle_size="auto"): a lone call is its own message, a flood is batched.

Real workers run every call; the fleet's publish is observed (not replaced) to see how each
ready group was sent.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support.fleet import assert_linked_pairs, call, run
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.dispatcher.send.publisher import (
    AUTO_DEEP_IN_FLIGHT,
    AUTO_MAX_BATCH,
    AUTO_MIN_CALLS,
    auto_plan,
)
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage

pytestmark = pytest.mark.usefixtures("sync_worker")


def _observe(fleet: Fleet) -> list[tuple[int, int | None]]:
    """Record (calls, bundle_size) of every publish the fleet makes, then publish as usual."""
    seen: list[tuple[int, int | None]] = []
    publish = fleet.publish

    async def observed(calls: Any, *, bundle_size: int | None = None, **kwargs: Any) -> None:
        seen.append((len(calls), bundle_size))
        await publish(calls, bundle_size=bundle_size, **kwargs)

    fleet.publish = observed  # type: ignore[method-assign]
    return seen


def test_auto_sends_lone_calls_one_per_message(fleet_settings: Settings) -> None:
    async def scenario(fleet: Fleet) -> tuple[Branch, list[Any], list[tuple[int, int | None]]]:
        seen = _observe(fleet)
        branch = Branch(fleet=fleet)
        results = []
        for i in range(3):
            params = CallParams(bundle_size="auto")
            results += await branch.act(call("echo", value=i), call_params=params)
        return branch, results, seen

    branch, results, seen = run(fleet_settings, scenario)
    assert [r.output for r in results] == [0, 1, 2]
    assert seen == [(1, None)] * 3  # shallow: single toolfleet.execute messages
    assert_linked_pairs(branch, results)


def test_auto_batches_a_flood_of_one_tool(fleet_settings: Settings) -> None:
    n = 200

    async def scenario(fleet: Fleet) -> tuple[Branch, list[Any], list[tuple[int, int | None]]]:
        seen = _observe(fleet)
        branch = Branch(fleet=fleet)
        params = CallParams(bundle_size="auto", max_in_flight=n)
        results = await branch.act([call("echo", value=i) for i in range(n)], call_params=params)
        return branch, results, seen

    branch, results, seen = run(fleet_settings, scenario, timeout_s=120)
    assert [r.output for r in results] == list(range(n))
    assert all(r.status is EventStatus.COMPLETED for r in results)
    batched = [(count, size) for count, size in seen if size is not None]
    # Deep: the calls ready together went as execute_many messages, not one per call.
    assert sum(count for count, _ in batched) >= n // 2, seen
    assert all(size is not None and 2 <= size <= AUTO_MAX_BATCH for _, size in batched)
    assert_linked_pairs(branch, results)


def test_auto_plan_groups_by_tool_and_keeps_small_groups_single() -> None:
    echo = Tool(func_callable=lambda value: value, function="echo")
    add = Tool(func_callable=lambda a, b: a + b, function="add")

    def msg(function: str) -> CallMessage:
        return CallMessage(call_id=str(uuid.uuid4()), function=function)

    flood = [(msg("echo"), echo) for _ in range(40)]
    few = [(msg("add"), add) for _ in range(AUTO_MIN_CALLS - 1)]
    plan = auto_plan(few[:3] + flood + few[3:])
    assert [(len(calls), size) for calls, size in plan] == [(AUTO_MIN_CALLS - 1, None), (40, 10)]
    assert {t.function for _, t in plan[1][0]} == {"echo"}
    big = auto_plan([(msg("echo"), echo) for _ in range(1000)])
    assert big[0][1] == AUTO_MAX_BATCH
    # Shallow, three ready calls go alone; with the queue deep they share one message.
    three = [(msg("echo"), echo) for _ in range(3)]
    assert [(len(c), s) for c, s in auto_plan(three)] == [(3, None)]
    assert [(len(c), s) for c, s in auto_plan(three, in_flight=AUTO_DEEP_IN_FLIGHT)] == [(3, 3)]
    lone = auto_plan(three[:1], in_flight=AUTO_DEEP_IN_FLIGHT)
    assert [(len(c), s) for c, s in lone] == [(1, None)]
