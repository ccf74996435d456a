"""A broker that never answered fails fast; a broker that answered once gets the outage's patience.

A wrong port is the first thing a new user meets. A ``Fleet`` that has never reached its broker
gives up within ``TOOLFLEET_CONNECT_LIMIT_S`` (10 s by default) with each call ABORTED
``BrokerError`` naming the masked URL and the setting to check, and ``toolfleet worker`` exits
2 within the same budget; a broker that was reached and then dies is an outage, retried for
``TOOLFLEET_OUTAGE_LIMIT_S`` (toolfleet.dispatcher.fleet.first_contact). The lost-mid-batch
outage itself: tests/integration/test_dead_broker.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli_support import toolfleet
from tests.support.fleet import call, start_worker
from tests.support.redis_server import PrivateRedis
from toolfleet import Branch, EventStatus, Fleet, Settings
from toolfleet.embedded.processes import free_port
from toolfleet.schemas.action import ActionResponseModel

TOOLS = ("tests.support.sample_tools",)
# Time past the budget for the last failed try, the history and the results.
MARGIN_S = 3.0


def _unreached_url() -> str:
    # A port nothing listens on: the connection is refused at once, every try.
    return f"redis://:hunter2@127.0.0.1:{free_port()}/0"


def _assert_aborted_naming_the_broker(
    results: list[ActionResponseModel], url: str, limit_s: float
) -> None:
    assert [r.status for r in results] == [EventStatus.ABORTED] * len(results)
    shown = url.replace(":hunter2@", ":***@")
    for result in results:
        error = result.error or ""
        assert error.startswith(f"BrokerError: the broker {shown} never answered"), error
        assert f"TOOLFLEET_CONNECT_LIMIT_S={limit_s:g}s" in error, error
        assert "TOOLFLEET_BROKER_URL" in error and "hunter2" not in error, error


def test_act_on_a_broker_never_reached_aborts_each_call_within_the_default_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    url = _unreached_url()
    settings = Settings(broker_url=url, tools=TOOLS)
    assert settings.connect_limit_s <= 10 < settings.outage_limit_s

    async def scenario() -> tuple[float, list[ActionResponseModel]]:
        started = time.monotonic()
        results = await Branch(fleet=Fleet(settings)).act(
            [call("add", a=1, b=2), call("echo", value="x")]
        )
        return time.monotonic() - started, results

    took_s, results = asyncio.run(scenario())
    assert took_s < settings.connect_limit_s + MARGIN_S, took_s
    _assert_aborted_naming_the_broker(results, url, settings.connect_limit_s)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("toolfleet.")]
    assert len(lines) <= 4, lines  # the broker unreachable, the journal: not one per retry
    assert not any("hunter2" in line for line in lines)


def test_act_sync_on_a_broker_never_reached_aborts_within_the_configured_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = _unreached_url()
    monkeypatch.setenv("TOOLFLEET_CONNECT_LIMIT_S", "2.5")
    fleet = Fleet(Settings.from_env(broker_url=url, tools=TOOLS))
    assert fleet.settings.connect_limit_s == 2.5
    started = time.monotonic()
    results = Branch(fleet=fleet).act_sync([call("add", a=1, b=2)])
    took_s = time.monotonic() - started
    assert took_s < 2.5 + MARGIN_S, took_s
    _assert_aborted_naming_the_broker(results, url, 2.5)


def test_a_worker_on_a_broker_never_reached_exits_2_within_the_budget(tmp_path: Path) -> None:
    url = _unreached_url()
    env = {"TOOLFLEET_BROKER_URL": url, "TOOLFLEET_CONNECT_LIMIT_S": "2"}
    started = time.monotonic()
    proc = toolfleet("worker", "--kind", "sync", home=tmp_path, env=env, timeout_s=60)
    took_s = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.strip()]
    shown = url.replace(":hunter2@", ":***@")
    assert f"the broker {shown} does not answer within TOOLFLEET_CONNECT_LIMIT_S=2s" in line, line
    assert "TOOLFLEET_BROKER_URL" in line and "hunter2" not in line, line
    # The interpreter and Celery start in about a second and a half of it.
    assert took_s < 2 + MARGIN_S + 2, took_s


@pytest.fixture()
def doomed_broker() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    yield server
    server.kill()


def test_a_broker_reached_once_then_lost_is_an_outage_not_a_wrong_url(
    doomed_broker: PrivateRedis,
) -> None:
    connect_limit_s, outage_limit_s = 1.0, 6.0
    settings = Settings(
        broker_url=doomed_broker.url,
        connect_limit_s=connect_limit_s,
        outage_limit_s=outage_limit_s,
        tools=TOOLS,
    )
    worker = start_worker("sync", redis_url=doomed_broker.url, concurrency=1)
    try:

        async def scenario() -> tuple[list[ActionResponseModel], float, list[ActionResponseModel]]:
            branch = Branch(fleet=Fleet(settings))
            first = await branch.act([call("add", a=1, b=2)])
            doomed_broker.kill()
            started = time.monotonic()
            second = await branch.act([call("add", a=2, b=3)])
            return first, time.monotonic() - started, second

        first, took_s, second = asyncio.run(scenario())
    finally:
        worker.kill()
    assert [r.status for r in first] == [EventStatus.COMPLETED]
    # Retried for the outage limit, not given up after the connect limit.
    assert outage_limit_s - 1 <= took_s < outage_limit_s + 10, took_s
    [result] = second
    assert result.status is EventStatus.ABORTED
    error = result.error or ""
    assert error.startswith("BrokerError: cannot enqueue"), error
    assert "never answered" not in error, error
