"""act() always returns on a dead broker, each call settled as its truth is, and the
dispatcher says so in a few lines, not one per call per retry: a broker unreachable from the
start (the quick start with the port wrong), and one SIGKILLed mid-batch and never back."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest

from tests.support.fleet import call, start_worker
from tests.support.redis_server import PrivateRedis
from tests.support.waiting import until
from toolfleet import Branch, EventStatus, Fleet, Settings

OUTAGE_LOGGER = "toolfleet.dispatcher.infra.outage_log"


def _broker_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("toolfleet.")
    ]


def test_a_broker_unreachable_from_the_start_aborts_each_call_within_the_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    settings = Settings(
        broker_url="redis://:hunter2@127.0.0.1:1/0",
        outage_limit_s=3,
        tools=("tests.support.sample_tools",),
    )
    started = time.monotonic()
    results = Branch(fleet=Fleet(settings)).act_sync(
        [call("add", a=1, b=2), call("echo", value="x"), call("sleep_async", seconds=0.1)]
    )
    assert time.monotonic() - started < 3 + 10
    assert [r.status for r in results] == [EventStatus.ABORTED] * 3
    for result in results:
        assert result.error is not None
        # Never reached: a wrong URL, given up on within the smaller of the two limits.
        assert result.error.startswith("BrokerError: the broker redis://:***@127.0.0.1:1/0 never")
        assert "TOOLFLEET_OUTAGE_LIMIT_S=3s" in result.error and "BROKER_URL" in result.error
        assert "redis://:***@127.0.0.1:1/0" in result.error and "hunter2" not in result.error
    lines = _broker_lines(caplog)
    assert sum("unreachable" in line for line in lines) == 1, lines
    assert len(lines) <= 4, lines  # the outage, the batch journal, nothing per retry
    assert not any("hunter2" in line for line in lines)


@pytest.fixture()
def doomed_broker() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    yield server
    server.kill()


def test_a_broker_lost_mid_batch_returns_with_a_summary_and_says_what_may_have_run(
    doomed_broker: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    limit_s = 12.0  # long enough for one 10 s summary
    worker = start_worker("sync", redis_url=doomed_broker.url, concurrency=2)
    try:
        settings = Settings(
            broker_url=doomed_broker.url,
            outage_limit_s=limit_s,
            tools=("tests.support.sample_tools",),
        )
        client = doomed_broker.client()

        async def scenario(fleet: Fleet) -> list[object]:
            branch = Branch(fleet=fleet)
            acting = asyncio.ensure_future(
                branch.act([call("sleep_sync", seconds=30), call("sleep_sync", seconds=30)])
            )
            # Both calls running on the worker (their started markers), then the broker dies.
            await asyncio.to_thread(
                until,
                lambda: len(list(client.scan_iter("toolfleet:started:*"))) == 2,
                timeout_s=30,
                what="both calls to start",
            )
            doomed_broker.kill()
            killed_at = time.monotonic()
            results = await acting
            return [time.monotonic() - killed_at, results]

        fleet = Fleet(settings)
        returned_after_s, results = asyncio.run(scenario(fleet))
    finally:
        worker.kill()
    assert returned_after_s < limit_s + 10
    for result in results:  # type: ignore[attr-defined]
        assert result.status is not EventStatus.COMPLETED
        assert "may have run" in (result.error or ""), result.error
    outage = [r.getMessage() for r in caplog.records if r.name == OUTAGE_LOGGER]
    assert sum("unreachable (" in line for line in outage) == 1, outage
    assert sum("still unreachable after" in line for line in outage) >= 1, outage
    assert len(_broker_lines(caplog)) <= 12, _broker_lines(caplog)
