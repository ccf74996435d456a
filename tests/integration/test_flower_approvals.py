"""Flower shows a call while it waits for approval, then how it ended (C10, approvals).

A real ``toolfleet flower`` watches real workers; ``Branch.act`` parks calls of a tool declared
``@tool(approval=True)``; the test decides them and reads Flower's API call by call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.approvals import parked, ran, refund
from tests.support.fleet import private_workers, run
from tests.support.flower import (
    FLOWER_EVENTS_TIMEOUT_S,
    FlowerProcess,
    api,
    start_flower,
    stop_flower,
)
from tests.support.waiting import until, until_async
from toolfleet import Branch, CallParams, EventStatus, Fleet
from toolfleet.schemas.settings import Settings
from toolfleet.workers.monitor import live_leases

TOOLS = ("tests.support.approval_tools",)
CARD = "4111-1111-1111-1111"


@pytest.fixture(scope="module")
def watched(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Settings, FlowerProcess]]:
    """A sync and an async worker of their own, and ``toolfleet flower`` watching them."""
    with private_workers(redis_url, "flower-approvals", tools=TOOLS) as env:
        settings = Settings.from_env(env, tools=TOOLS)
        flower_env = {**env, "FLOWER_UNAUTHENTICATED_API": "true"}
        flower = start_flower(redis_url, tmp_path_factory.mktemp("flower-run"), env=flower_env)
        try:
            # Flower asks for events once its receiver listens; the workers' leases say they
            # heard it, so the dispatcher (which reads the same leases) sends its events too.
            client = redis.Redis.from_url(redis_url)
            try:
                until(
                    lambda: len(live_leases(client, settings.key("monitor"))) >= 2,
                    timeout_s=FLOWER_EVENTS_TIMEOUT_S,
                    what="both workers to take the monitor lease Flower asked for",
                )
            finally:
                client.close()
            yield settings, flower
        finally:
            stop_flower(flower)


async def flower_task(flower: FlowerProcess, call_id: str, state: str) -> dict[str, Any]:
    """Flower's record of ``call_id`` once it shows ``state``."""

    async def shown() -> dict[str, Any] | None:
        task = await asyncio.to_thread(api, flower, f"/api/task/info/{call_id}")
        return task if task is not None and task.get("state") == state else None

    return await until_async(
        shown, timeout_s=FLOWER_EVENTS_TIMEOUT_S, interval_s=0.1, what=f"{call_id} {state}"
    )


def test_flower_shows_parked_calls_awaiting_approval_then_run_or_revoked(
    watched: tuple[Settings, FlowerProcess], tmp_path: Path
) -> None:
    settings, flower = watched
    side = tmp_path / "side"

    async def scenario(fleet: Fleet) -> None:
        branch = Branch(fleet=fleet)
        calls = [refund(side, 1, 10, card=CARD), refund(side, 2, 900, card=CARD)]
        acting = asyncio.create_task(branch.act(calls))

        small, large = sorted(
            await parked(fleet, 2), key=lambda request: request.arguments["amount"]
        )
        for request in (small, large):
            task = await flower_task(flower, request.call_id, "AWAITING_APPROVAL")
            assert task["name"] == "tool:refund"
            assert f"'amount': {request.arguments['amount']}" in task["args"]
            assert CARD not in task["args"] and "***" in task["args"]
        assert not side.exists()  # nothing ran while they waited

        await fleet.approve(small.call_id)
        await fleet.deny(large.call_id, "over the refund limit")
        ran, refused = await asyncio.wait_for(acting, 30)
        assert ran.output == "refunded 10"
        assert refused.status is EventStatus.SKIPPED
        assert (await flower_task(flower, small.call_id, "SUCCESS"))["name"] == "tool:refund"
        revoked = await flower_task(flower, large.call_id, "REVOKED")
        assert revoked["revoked"] is not None

        # No one decides in time: the call expires, and Flower shows it revoked too.
        [expired] = await branch.act(
            [refund(side, 3, 20, card=CARD)], call_params=CallParams(approval_timeout_s=0.5)
        )
        assert "no one approved it" in expired.output["error"]
        await flower_task(flower, expired.call_id or "", "REVOKED")

    run(settings, scenario, timeout_s=90)
    assert ran(side) == [("refund", 1)]
