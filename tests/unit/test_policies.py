"""Each policy toolfleet once wrote in several places has one home; these tests exercise each
home the way its former copies used it: the queue a call goes to, masking a URL, retrying
through an outage, "does a monitor watch?", calling a user's callback, "found nowhere twice,
a grace apart"."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from toolfleet.broker.liveness import WATCH_CACHE_S, MonitorWatch, live_leases
from toolfleet.broker.outage import FIRST_DELAY_S, OutageRetry, through_outage
from toolfleet.dispatcher.govern.callbacks import call_user, callback_name, error_text
from toolfleet.dispatcher.govern.hooks import HookBus, HookPoint
from toolfleet.dispatcher.govern.permissions import PermissionPolicy
from toolfleet.dispatcher.watch.whereabouts import NowhereTwice, Place
from toolfleet.schemas.action import ToolInvocation
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings, masked_url

# -- the queue a call goes to ---------------------------------------------------------------


def test_a_call_goes_to_its_kinds_queue() -> None:
    settings = Settings(sync_queue="s", async_queue="a")
    assert settings.queue_for("async") == "a"
    assert settings.queue_for("sync") == "s"
    assert settings.queue_for(None) == "s"  # a tool of no declared kind runs on prefork


# -- masking a URL ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shown", "masked"),
    [
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("redis://user:pw@host/1", "redis://user:***@host/1"),
        ("rediss://user:p@ss@host:6380/0", "rediss://user:***@host:6380/0"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://user@host/0", "redis://user@host/0"),  # a user name is no secret
        ("redis://host/0?password=pw&db=1", "redis://host/0?password=***&db=1"),
        ("redis://:**@host/0", "redis://:***@host/0"),  # kombu's own masking, ours now
        (
            "could not enqueue 2 call(s) on 'redis://:pw@h:1/0': Error 111 connecting to h:1",
            "could not enqueue 2 call(s) on 'redis://:***@h:1/0': Error 111 connecting to h:1",
        ),
    ],
)
def test_masked_url_hides_every_password_and_nothing_else(shown: str, masked: str) -> None:
    assert masked_url(shown) == masked


def test_masked_url_leaves_what_is_not_text() -> None:
    assert masked_url(None) is None
    assert masked_url(6379) == 6379


# -- retrying through an outage ----------------------------------------------------------------


def test_through_outage_retries_a_broker_error_until_it_passes() -> None:
    tries: list[float] = []
    told: list[str] = []

    async def flaky() -> str:
        tries.append(time.monotonic())
        if len(tries) < 3:
            raise redis.ConnectionError("Error 111 connecting")
        return "in"

    def on_retry(error: BaseException, retry: OutageRetry) -> None:
        told.append(type(error).__name__)

    assert asyncio.run(through_outage(flaky, 5.0, on_retry=on_retry)) == "in"
    assert len(tries) == 3 and told == ["ConnectionError", "ConnectionError"]
    assert tries[1] - tries[0] >= FIRST_DELAY_S * 0.9  # backoff: 0.2 s, then 0.4 s
    assert tries[2] - tries[1] >= 2 * FIRST_DELAY_S * 0.9


def test_through_outage_gives_up_at_the_limit_and_never_retries_a_refusal() -> None:
    tries = 0

    async def down() -> None:
        nonlocal tries
        tries += 1
        raise redis.TimeoutError("no reply")

    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        asyncio.run(through_outage(down, 0.5))
    assert 0.5 <= time.monotonic() - started < 2.0 and tries >= 2

    async def refused() -> None:
        nonlocal tries
        tries += 1
        raise redis.ResponseError("WRONGTYPE")

    tries = 0
    with pytest.raises(redis.ResponseError):
        asyncio.run(through_outage(refused, 5.0))
    assert tries == 1
    with pytest.raises(redis.ConnectionError):  # no limit: no retry (a store without one)
        asyncio.run(through_outage(_fails_once(), 0.0))


def _fails_once() -> Any:
    async def operation() -> None:
        raise redis.ConnectionError("down")

    return operation


def test_the_one_outage_limit_default_is_settings() -> None:
    from toolfleet.dispatcher.watch import broker_watch
    from toolfleet.workers.store import AsyncRecordStore

    default = Settings().outage_limit_s
    assert not hasattr(broker_watch, "OUTAGE_LIMIT_S")
    store = AsyncRecordStore(redis.asyncio.Redis(), Keys(), record_ttl_s=60)
    assert store.outage_limit_s == default
    no_collector: Any = None  # the watch's defaults are read, it is never started
    watch = broker_watch.BrokerWatch(
        redis.asyncio.Redis(), no_collector, Keys(), "redis://:pw@h:1/0"
    )
    assert watch.outage_limit_s == default
    assert watch.broker_url == "redis://:***@h:1/0"


# -- does a monitor watch? ----------------------------------------------------------------------


class _Leases:
    """A client whose HGETALL of the monitor key answers ``leases``; counts the reads."""

    def __init__(self, leases: dict[bytes, bytes]) -> None:
        self.leases = leases
        self.reads = 0

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        assert key == Keys("fleet").monitor() == "fleet:monitor"
        self.reads += 1
        return self.leases


class _AsyncLeases(_Leases):
    async def hgetall(self, key: str) -> dict[bytes, bytes]:  # type: ignore[override]
        return super().hgetall(key)


def test_both_readers_share_one_answer_read_at_most_once_per_cache_period() -> None:
    now = [100.0]
    watch = MonitorWatch(Keys("fleet").monitor(), clock=lambda: now[0])
    live = repr(time.time() + 30).encode()
    sync_client, async_client = _Leases({b"w@h": live}), _AsyncLeases({})
    assert watch.read(sync_client) is True
    assert asyncio.run(watch.read_async(async_client)) is True  # the sync read's answer
    assert (sync_client.reads, async_client.reads) == (1, 0)
    now[0] += WATCH_CACHE_S
    assert asyncio.run(watch.read_async(async_client)) is False  # stale: read again
    assert watch.read(sync_client) is False and sync_client.reads == 1
    assert MonitorWatch("k", always=True).read(None) is True  # TASK_EVENTS=always: no read


def test_only_live_leases_count() -> None:
    now = time.time()
    raw = {b"a@h": repr(now + 5).encode(), b"b@h": repr(now - 1).encode(), b"c@h": b"x"}
    assert live_leases(raw, now) == {"a@h": pytest.approx(now + 5)}


# -- calling a user's callback ------------------------------------------------------------------


def test_call_user_awaits_what_needs_awaiting_and_names_the_callback() -> None:
    async def approve(*args: Any) -> bool:
        return True

    def refuse(*args: Any) -> bool:
        return False

    assert asyncio.run(call_user(approve, "bash", "ls", {})) is True
    assert asyncio.run(call_user(refuse, "bash", "ls", {})) is False
    assert callback_name(refuse).endswith("refuse")
    assert callback_name(object()).startswith("<object object")
    assert error_text(ValueError("boom")) == "ValueError: boom"


def test_every_former_copy_names_the_callback_the_same_way() -> None:
    from toolfleet.dispatcher.session import Session

    def broken(payload: Any) -> None:
        raise ValueError("boom")

    async def async_gate(invocation: ToolInvocation) -> bool:
        raise RuntimeError("no")

    bus = HookBus()
    bus.on(HookPoint.TOOL_POST, broken)
    (failure,) = asyncio.run(bus.emit(HookPoint.TOOL_POST, {}))
    assert failure.handler == callback_name(broken)

    session = Session()
    session.gate(async_gate)
    reason = asyncio.run(session.authorize(ToolInvocation(function="f", arguments={})))
    assert reason == f"gate {callback_name(async_gate)} raised RuntimeError: no"

    async def approve(tool: str, action: str, args: dict[str, Any]) -> bool:
        return action == "ls"

    policy = PermissionPolicy(escalate={"bash": ["*"]}, on_escalate=approve)
    assert asyncio.run(policy.authorize("bash", {"action": "ls"})).allowed
    assert not asyncio.run(policy.authorize("bash", {"action": "rm"})).allowed


# -- found nowhere twice, a grace apart ---------------------------------------------------------


def test_nowhere_twice_a_grace_apart_with_nothing_seen_between() -> None:
    nowhere = NowhereTwice()
    assert not nowhere.saw(Place.NOWHERE, 0.0, 5.0)  # first look: maybe in transit
    assert not nowhere.saw(Place.NOWHERE, 4.9, 5.0)  # not a grace apart yet
    assert nowhere.saw(Place.NOWHERE, 5.0, 5.0)
    assert not nowhere.saw(Place.QUEUED, 6.0, 5.0)  # seen somewhere: the count starts again
    assert not nowhere.saw(Place.NOWHERE, 7.0, 5.0)
    assert nowhere.saw(Place.NOWHERE, 12.0, 5.0)
    nowhere.reset()  # sent again
    assert not nowhere.saw(Place.NOWHERE, 13.0, 5.0)
