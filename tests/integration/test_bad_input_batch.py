"""Bad input in a batch (D1, C1: each bad call fails alone), property-based, over real Redis
and real workers.

Every generated batch mixes bad calls of every kind (malformed envelopes, unknown tools,
arguments that are not JSON, wrong types for a request model, oversized and deeply nested
arguments; and also lone surrogates, non-string keys, integers past 64 bits and
values whose repr() raises, in arguments and in function names) with valid calls. Each bad
call gets its own specific error and nothing is enqueued for it; the dispatcher never
crashes; every valid call completes; every call has its linked request/response pair, in
input order, in memory and in Redis.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import tests.support.reliability_tools  # noqa: F401  (the dispatcher validates against its tools)
from tests.support.fleet import assert_linked_pairs
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.workers.registry import registry

pytestmark = pytest.mark.usefixtures("sync_worker")

MAX_ARGUMENT_BYTES = 4096
SECRET = "S3CRET-bad-input-4b1d"


@dataclass(frozen=True)
class Bad:
    """One bad request and what its error must say."""

    request: Any
    error_type: str
    mentions: str = ""


class NoFields(BaseModel):
    name: str = "x"


class OnlyFunction(BaseModel):
    function: str = "echo"


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


not_json = st.one_of(
    st.binary(max_size=8),
    st.sets(st.integers(), min_size=1, max_size=3),
    st.builds(object),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
)

malformed = st.one_of(
    st.integers(),
    st.text(max_size=10),
    st.none(),
    st.binary(max_size=5),
    st.lists(st.integers(), max_size=3),
    st.fixed_dictionaries({"function": st.just("echo")}),
    st.fixed_dictionaries({"arguments": st.just({})}),
    st.fixed_dictionaries(
        {"function": st.one_of(st.integers(), st.none(), st.just("")), "arguments": st.just({})}
    ),
    st.builds(NoFields),
    st.builds(OnlyFunction),
).map(lambda r: Bad(r, "MalformedRequestError"))

unknown_tool = (
    st.text(min_size=1, max_size=12)
    .filter(lambda name: name not in registry)
    .map(lambda name: Bad({"function": name, "arguments": {}}, "UnknownToolError", repr(name)))
)

non_json_arguments = st.one_of(
    not_json, st.lists(not_json, min_size=1, max_size=2).map(lambda v: {"deep": v})
).map(lambda v: Bad({"function": "echo", "arguments": {"value": v}}, "NotJSONError", "'value'"))

wrong_types = st.one_of(
    st.integers(),
    st.floats(allow_nan=False),
    st.lists(st.text(max_size=3), max_size=2),
    st.none(),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
).map(
    lambda q: Bad(
        {"function": "search", "arguments": {"query": q, "api_key": SECRET}},
        "ArgumentValidationError",
        "SearchRequest",
    )
)

oversized = st.integers(MAX_ARGUMENT_BYTES, 4 * MAX_ARGUMENT_BYTES).map(
    lambda n: Bad(
        {"function": "echo", "arguments": {"value": "x" * n}},
        "OversizedArgumentsError",
        str(MAX_ARGUMENT_BYTES),
    )
)

too_deep = st.integers(150, 3000).map(
    lambda d: Bad(
        {"function": "echo", "arguments": {"value": nested(d)}}, "ArgumentValidationError", "nested"
    )
)

# Values that used to escape the per-call checks and fail the whole batch.
surrogate = st.builds(
    lambda head, code, tail: head + chr(code) + tail,
    st.text(max_size=4),
    st.integers(0xD800, 0xDFFF),
    st.text(max_size=4),
)


class RaisingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


hostile_value = st.one_of(
    surrogate.map(lambda t: (t, "lone surrogate U+")),
    surrogate.map(lambda t: ({"k": [t]}, "lone surrogate U+")),
    surrogate.map(lambda t: ({t: 1}, "lone surrogate U+")),
    st.integers(1, 3).map(lambda k: ({k: "x"}, "not a string")),
    st.integers(64, 20_000).map(lambda bits: (2**bits, "64-bit range")),
    st.integers(64, 20_000).map(lambda bits: ([-(2**bits)], "64-bit range")),
    st.just((RaisingRepr(), "RaisingRepr is not JSON")),
)

hostile_arguments = hostile_value.map(
    lambda vs: Bad({"function": "echo", "arguments": {"value": vs[0]}}, "NotJSONError", vs[1])
)

hostile_unknown_tool = st.one_of(
    surrogate.map(lambda name: Bad({"function": name, "arguments": {}}, "UnknownToolError")),
    hostile_value.map(
        lambda vs: Bad({"function": "no_such_tool", "arguments": {"v": vs[0]}}, "UnknownToolError")
    ),
    st.just(Bad({"function": "no_such_tool", "arguments": {1: "x"}}, "UnknownToolError")),
)

bad_calls = st.one_of(
    malformed,
    unknown_tool,
    non_json_arguments,
    wrong_types,
    oversized,
    too_deep,
    hostile_arguments,
    hostile_unknown_tool,
)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def fleet(fleet_settings: Settings, loop: asyncio.AbstractEventLoop) -> Iterator[Fleet]:
    """One fleet for every generated batch (its collector lives on the module's loop)."""
    settings = fleet_settings.model_copy(
        update={
            "max_argument_bytes": MAX_ARGUMENT_BYTES,
            "tools": ("tests.support.sample_tools", "tests.support.reliability_tools"),
        }
    )
    fleet = Fleet(settings)
    yield fleet
    loop.run_until_complete(fleet.aclose())


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(bad=st.lists(bad_calls, min_size=1, max_size=4), valid_at=st.integers(0, 4))
def test_each_bad_call_fails_alone_with_its_own_error_and_the_batch_completes(
    fleet: Fleet, loop: asyncio.AbstractEventLoop, bad: list[Bad], valid_at: int
) -> None:
    valid_at = min(valid_at, len(bad))
    requests: list[Any] = [b.request for b in bad]
    requests.insert(valid_at, {"function": "echo", "arguments": {"value": "still here"}})
    # A second valid call after every bad one: all valid results must be present.
    requests.append({"function": "echo", "arguments": {"value": "still here"}})
    branch = Branch(fleet=fleet)

    results = loop.run_until_complete(asyncio.wait_for(branch.act(requests), 30))

    assert len(results) == len(requests)
    expected: list[Bad | None] = [*bad]
    expected.insert(valid_at, None)
    expected.append(None)
    for result, want in zip(results, expected, strict=True):
        if want is None:
            assert result.status is EventStatus.COMPLETED
            assert result.output == "still here"
            continue
        # Stopped before enqueue, with the specific error of this call.
        assert result.status is EventStatus.ABORTED, (want, result)
        assert result.error is not None
        assert result.error.startswith(f"{want.error_type}: "), (want, result.error)
        assert want.mentions in result.error, (want, result.error)
    # History: a linked pair per call, in input order; nothing leaks the secret.
    assert len(results) == len(requests)
    assert_linked_pairs(branch, results)
    messages = branch.messages
    assert len(branch.events) == len(requests)
    recorded = json.dumps([m.model_dump(mode="json") for m in messages]) + json.dumps(
        [e.to_dict() for e in branch.events], default=str
    )
    assert SECRET not in recorded
    loaded = loop.run_until_complete(asyncio.wait_for(Branch.load(branch.id, fleet=fleet), 10))
    assert [m.id for m in loaded.messages] == [m.id for m in messages]
    assert all(SECRET not in (r.error or "") for r in results)
