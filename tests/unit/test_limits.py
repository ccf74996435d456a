"""The declarations of the fleet-wide controls, and their scripts against a real Redis
(docs/controls.md); the workers that hold them are in tests/integration/test_controls.py."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from toolfleet import ErrorInfo, RateLimitedError, ToolfleetError, rebuild_error
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.limits import DEFAULT_LIMIT_WAIT_S, RateLimit, limit_fields, limit_scope
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage
from toolfleet.workers.limit_scripts import (
    SLOT_ACQUIRE_SCRIPT,
    SLOT_RENEW_SCRIPT,
    TOKEN_BUCKET_SCRIPT,
)
from toolfleet.workers.registry import Registry, tool


def search(tenant: str, query: str = "", api_key: str = "") -> str:
    return query


@pytest.mark.parametrize(
    ("text", "per_second", "burst"),
    [("20/s", 20.0, 20.0), ("100/m", 100 / 60, 1.6666666666666667), ("1/h", 1 / 3600, 1.0)],
)
def test_a_rate_is_n_per_second_minute_or_hour_with_one_seconds_burst(
    text: str, per_second: float, burst: float
) -> None:
    rate = RateLimit.parse(text)
    assert rate.per_second == pytest.approx(per_second)
    assert rate.burst == pytest.approx(burst)
    assert rate.text == text


@pytest.mark.parametrize("text", ["20", "0/s", "20/day", "-1/s", "fast"])
def test_a_rate_in_another_form_is_refused_saying_how_to_write_it(text: str) -> None:
    with pytest.raises(ValueError, match=r"'N/s', 'N/m' or 'N/h'"):
        RateLimit.parse(text)


def test_tool_options_reach_the_tool_and_cost_nothing_when_absent() -> None:
    reg = Registry()
    tool(rate_limit="5/m", max_concurrency=2, limit_key="tenant", registry=reg)(search)
    declared = reg.get("search")
    assert declared.rate_limit == RateLimit.parse("5/m")
    assert (declared.max_concurrency, declared.limit_key, declared.limited) == (2, "tenant", True)
    plain = Tool(func_callable=search)
    assert not plain.limited
    assert limit_fields(plain, 30.0, "s1") == {}  # its message stays as it was
    assert limit_fields(declared, 5.0, "s1") == {"limit_wait_s": 5.0}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"limit_key": "tenant"}, "has no limit"),
        ({"max_concurrency": 2, "limit_key": "user"}, "not a parameter"),
        ({"max_concurrency": 0}, "greater than or equal to 1"),
        ({"rate_limit": "1/s", "limit_key": "api_key", "secret_args": ["api_key"]}, "secret"),
    ],
)
def test_a_limit_that_cannot_hold_is_refused_where_the_tool_is_made(
    options: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValidationError, match=words):
        Tool(func_callable=search, **options)


def test_branch_and_session_are_refused_for_a_tool_with_a_parameter_of_that_name() -> None:
    def chat(session: str) -> str:
        return session

    with pytest.raises(ValidationError, match="ambiguous"):
        Tool(func_callable=chat, rate_limit="1/s", limit_key="session")
    assert Tool(func_callable=search, rate_limit="1/s", limit_key="branch").limited


def test_a_scope_is_the_tool_an_argument_the_branch_or_the_session() -> None:
    args = {"tenant": "acme", "n": 3}
    assert limit_scope(None, args, branch_id="b", session_id="s").value == "*"
    scope = limit_scope("tenant", args, branch_id="b", session_id="s")
    assert (scope.value, scope.phrase()) == ("tenant=acme", " for tenant 'acme'")
    assert limit_scope("n", args, branch_id="b", session_id="s").value == "n=3"
    assert limit_scope("branch", args, branch_id="b", session_id="s").value == "branch=b"
    assert limit_scope("session", args, branch_id="b", session_id="s").value == "session=s"
    # A branch without a session is its own session.
    assert limit_scope("session", args, branch_id="b", session_id=None).value == "session=b"
    long = limit_scope("tenant", {"tenant": "x" * 500}, branch_id=None, session_id=None)
    assert long.value.startswith("tenant=sha256:") and len(long.shown) < 80


def test_rate_limited_error_carries_retry_after_as_data_never_read_from_its_text() -> None:
    text = "rate limit 20/s for tenant 'acme' reached; retry after 0.4 s"
    error = RateLimitedError(text, retry_after_s=0.4)
    assert isinstance(error, ToolfleetError)
    assert ErrorInfo.of(error).fields == {"retry_after_s": 0.4}
    rebuilt = rebuild_error(ErrorInfo.of(error))
    assert isinstance(rebuilt, RateLimitedError) and rebuilt.retry_after_s == 0.4
    assert RateLimitedError(text).retry_after_s is None  # the text is for reading only


def test_limit_wait_defaults_to_30_s_and_travels_only_when_set() -> None:
    assert CallParams().limit_wait_s == DEFAULT_LIMIT_WAIT_S == 30.0
    with pytest.raises(ValidationError):
        CallParams(limit_wait_s=-1)
    plain = CallMessage(call_id="c", function="f")
    assert "limit_wait_s" not in plain.model_dump() and "session_id" not in plain.model_dump()
    limited = CallMessage(call_id="c", function="f", limit_wait_s=2, session_id="s")
    assert CallMessage.model_validate(limited.model_dump(mode="json")) == limited


def test_the_token_bucket_takes_reserves_or_refuses(redis_client: redis.Redis) -> None:
    bucket = redis_client.register_script(TOKEN_BUCKET_SCRIPT)
    key = f"test-limits:rate:{uuid.uuid4().hex}"

    def take(budget_s: float) -> tuple[int, float]:
        granted, wait_s = bucket(keys=[key], args=[repr(10.0), repr(2.0), repr(budget_s)])
        return int(granted), float(wait_s)

    assert take(0) == (1, 0.0)  # a full bucket: the burst of 2 ...
    assert take(0) == (1, 0.0)
    granted, wait_s = take(0)  # ... then none now, and a wait of 0.1 s is too long
    assert granted == 0 and 0.05 < wait_s <= 0.1
    granted, wait_s = take(1.0)  # reserved: due in about 0.1 s
    assert granted == 1 and 0.05 < wait_s <= 0.1
    granted, wait_s = take(1.0)  # the next queues behind it
    assert granted == 1 and 0.15 < wait_s <= 0.2
    assert 0 < redis_client.pttl(key) <= 2000  # gone once full again


def test_a_slot_is_a_lease_that_lapses_and_a_holder_keeps_its_own(
    redis_client: redis.Redis,
) -> None:
    take = redis_client.register_script(SLOT_ACQUIRE_SCRIPT)
    renew = redis_client.register_script(SLOT_RENEW_SCRIPT)
    key = f"test-limits:slots:{uuid.uuid4().hex}"

    def acquire(call_id: str, lease_s: float = 0.3) -> int:
        return int(take(keys=[key], args=["1", repr(lease_s), call_id]))

    assert acquire("a") == 1
    assert acquire("b") == 0  # the cap is 1
    assert acquire("a") == 1  # a redelivery of the holder keeps its slot
    assert int(renew(keys=[key], args=["0.3", "a"])) == 1
    assert int(renew(keys=[key], args=["0.3", "b"])) == 0  # renewing never takes a slot
    time.sleep(0.4)  # a's lease lapses (its worker died: no renewal)
    assert acquire("b") == 1
    assert redis_client.zrange(key, 0, -1) == [b"b"]
