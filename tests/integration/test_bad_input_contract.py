"""The strict JSON contract (D1, C1): checked before enqueue, each breach an ABORTED
call naming the offending path; the paths that record a call (history, logs, repr) are total,
so no caller value can fail its neighbours or hang act().
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.fleet import assert_linked_pairs, call, run
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.contract import MAX_INT, check_arguments, safe_repr, safe_text
from toolfleet.schemas.errors import ArgumentValidationError, NotJSONError, OversizedArgumentsError
from toolfleet.schemas.serialize import to_jsonable
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

HUGE = 10**5000  # str() of this raises ValueError (the 4300-digit limit)


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr refused")

    __str__ = __repr__


# -- the contract as a pure function ----------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error", "says"),
    [
        (
            {"items": [{}, {}, {}, {"name": "a\ud800"}]},
            NotJSONError,
            "arguments.items[3].name: lone surrogate U+D800",
        ),
        ({"value": {1: "x"}}, NotJSONError, "arguments.value: key 1 is a int, not a string"),
        ({"a b": ["\udfff"]}, NotJSONError, 'arguments["a b"][0]: lone surrogate U+DFFF'),
        ({"value": HUGE}, NotJSONError, "integer of 5001 digits is outside the 64-bit range"),
        ({"value": MAX_INT + 1}, NotJSONError, "pass it as a string"),
        ({"value": [float("nan")]}, NotJSONError, "arguments.value[0]: nan is not JSON"),
        ({"value": BadRepr()}, NotJSONError, "arguments.value: BadRepr is not JSON"),
        ({"value": b"x"}, NotJSONError, "bytes is not JSON"),
        ({"value": "x" * 200}, OversizedArgumentsError, "over the 100-byte limit"),
    ],
)
def test_each_breach_names_its_path_and_the_fix(
    arguments: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as caught:
        check_arguments("echo", arguments, max_bytes=100)
    assert says in str(caught.value)
    assert str(caught.value).encode()  # the message itself is valid UTF-8


def test_depth_is_bounded_without_recursion_and_a_cycle_is_caught() -> None:
    deep: Any = "leaf"
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(ArgumentValidationError, match="nested more than 100 levels"):
        check_arguments("echo", {"value": deep}, max_bytes=10**9)
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ArgumentValidationError, match="nested"):
        check_arguments("echo", {"value": loop}, max_bytes=10**9)
    at_limit: Any = "leaf"
    for _ in range(100):
        at_limit = [at_limit]
    assert check_arguments("echo", {"value": at_limit}, max_bytes=10**9) > 0


def test_recording_paths_are_total() -> None:
    assert safe_text("a\ud800b") == "a\\ud800b"
    assert "BadRepr" in safe_repr(BadRepr())
    assert safe_repr(HUGE) == "<unrepresentable int>"
    assert len(safe_repr("x" * 10_000)) <= 80
    recorded = to_jsonable({"s": "\ud800", "n": HUGE, 1: "one", "k": {b"x": 1}})
    assert recorded == {
        "s": "\\ud800",
        "n": "<integer of about 5001 digits>",
        "1": "one",
        "k": {"b'x'": 1},
    }
    assert to_jsonable({"r": BadRepr()}) == "<unserializable>"


# -- real workers: one batch of hostile calls among valid ones --------------------------


HOSTILE: list[tuple[Any, str]] = [
    (call("echo", value="a\ud800"), "arguments.value: lone surrogate U+D800"),
    (call("echo", value={"items": [{"name": "\udc00"}]}), "arguments.value.items[0].name"),
    ({"function": "ech\ud800", "arguments": {"x": 1}}, "UnknownToolError"),
    ({"function": "no_such", "arguments": {"x": "\ud800"}}, "UnknownToolError"),
    ({"function": "no_such", "arguments": {1: "x"}}, "UnknownToolError"),
    ({"function": "echo", "arguments": {1: "x"}}, "must be strings"),
    (call("echo", value={2: "x"}), "key 2 is a int, not a string"),
    (call("echo", value=HUGE), "integer of 5001 digits"),
    (call("echo", value=BadRepr()), "BadRepr is not JSON"),
    ({"function": BadRepr(), "arguments": {}}, "MalformedRequestError"),
]


def test_hostile_calls_fail_alone_and_their_neighbours_finish(
    fleet_settings: Settings, sync_worker: object
) -> None:
    requests: list[Any] = []
    for request, _ in HOSTILE:
        requests += [request, call("echo", value=len(requests))]

    async def scenario(fleet: Fleet) -> tuple[Branch, list[Any], Branch]:
        branch = Branch(fleet=fleet)
        results = await branch.act(requests, suppress_errors=True)
        return branch, results, await Branch.load(branch.id, fleet=fleet)

    branch, results, loaded = run(fleet_settings, scenario, timeout_s=60)
    assert len(results) == len(requests)
    for i, (_, says) in enumerate(HOSTILE):
        bad, good = results[2 * i], results[2 * i + 1]
        assert bad.status is EventStatus.ABORTED, (i, bad)
        assert says in bad.error, (i, bad.error)
        assert good.status is EventStatus.COMPLETED and good.output == 2 * i
    assert_linked_pairs(branch, results)
    # The history reached Redis whole, and reads back.
    assert [m.id for m in loaded.messages] == [m.id for m in branch.messages]
    assert len(loaded.events) == len(requests)
