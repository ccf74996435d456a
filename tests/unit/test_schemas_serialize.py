"""to_jsonable and Execution.to_dict/from_dict: an event as it is stored (pure logic)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import threading
import uuid
from collections import OrderedDict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from toolfleet.schemas import (
    UNSERIALIZABLE,
    EventStatus,
    Execution,
    describe_exception,
    format_error,
    to_jsonable,
)


class _Point(BaseModel):
    x: int
    when: dt.datetime


@dataclasses.dataclass
class _Box:
    label: str
    point: _Point
    tags: frozenset[str]


class _Color(enum.Enum):
    RED = "red"


class _Level(enum.IntEnum):
    HIGH = 3


_WHEN = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def test_execution_to_dict_converts_models_dataclasses_mappings_sequences_sets_datetimes() -> None:
    response = {
        "model": _Point(x=1, when=_WHEN),
        "dataclass": _Box(label="b", point=_Point(x=2, when=_WHEN), tags=frozenset({"z", "a"})),
        "mapping": OrderedDict([(1, "one"), ("two", 2)]),
        "tuple": (1, "a", None),
        "list": [1.5, True],
        "set": {3, 1, 2},
        "datetime": _WHEN,
        "date": dt.date(2026, 1, 2),
        "time": dt.time(3, 4),
        "timedelta": dt.timedelta(minutes=1, milliseconds=500),
        "uuid": uuid.UUID(int=1),
        "enum": _Color.RED,
        "int_enum": _Level.HIGH,
        "exception": KeyError("k"),
    }
    execution = Execution(
        status=EventStatus.COMPLETED, duration=0.25, response=response, retryable=False
    )
    data = execution.to_dict()
    assert data["status"] == "completed"
    assert data["duration"] == 0.25
    assert data["retryable"] is False
    assert data["error"] is None
    assert data["response"] == {
        "model": {"x": 1, "when": "2026-01-02T03:04:05+00:00"},
        "dataclass": {
            "label": "b",
            "point": {"x": 2, "when": "2026-01-02T03:04:05+00:00"},
            "tags": ["a", "z"],
        },
        "mapping": {"1": "one", "two": 2},
        "tuple": [1, "a", None],
        "list": [1.5, True],
        "set": [1, 2, 3],
        "datetime": "2026-01-02T03:04:05+00:00",
        "date": "2026-01-02",
        "time": "03:04:00",
        "timedelta": 60.5,
        "uuid": "00000000-0000-0000-0000-000000000001",
        "enum": "red",
        "int_enum": 3,
        "exception": {"error": "KeyError", "message": "'k'"},
    }
    # Plain JSON types, not subclasses that happen to serialize.
    assert type(data["response"]["int_enum"]) is int
    json.dumps(data, allow_nan=False)


def test_any_unserializable_part_makes_the_whole_response_the_marker() -> None:
    for bad in (
        {"deep": [[{"x": object()}]]},
        [b"raw bytes"],
        {"f": float("nan")},
        {"inf": math.inf},
        threading.Lock(),
    ):
        assert to_jsonable(bad) == UNSERIALIZABLE, bad


def test_self_referencing_response_becomes_marker() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert to_jsonable(loop) == UNSERIALIZABLE


def test_value_whose_conversion_raises_becomes_marker() -> None:
    class Exploding(BaseModel):
        def model_dump(self, **kwargs: Any) -> dict[str, Any]:
            raise RuntimeError("cannot dump")

    assert to_jsonable({"x": Exploding()}) == UNSERIALIZABLE


def test_exception_helpers_shapes() -> None:
    exc = ValueError("bad value 7")
    assert describe_exception(exc) == {"error": "ValueError", "message": "bad value 7"}
    assert format_error(exc) == "ValueError: bad value 7"


def test_execution_from_dict_round_trips_through_json() -> None:
    execution = Execution(
        status=EventStatus.FAILED, duration=1.5, response={"partial": [1]}, retryable=True
    )
    execution.add_error(ConnectionError("refused"))
    data = json.loads(json.dumps(execution.to_dict()))
    rebuilt = Execution.from_dict(data)
    assert rebuilt.status is EventStatus.FAILED
    assert rebuilt.duration == 1.5
    assert rebuilt.response == {"partial": [1]}
    assert rebuilt.retryable is True
    # Errors stay in their serialized form: "<Type>: <message>".
    assert rebuilt.error == "ConnectionError: refused"
    assert rebuilt.to_dict()["error"] == "ConnectionError: refused"


# -- properties --------------------------------------------------------------------------

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_json_values = st.recursive(
    _json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)
_odd_scalars = (
    _json_scalars
    | st.floats()  # includes nan/inf
    | st.binary(max_size=4)
    | st.datetimes()
    | st.dates()
    | st.uuids()
    | st.sampled_from([_Color.RED, _Level.HIGH, object(), threading.Lock(), KeyError("x")])
    | st.builds(_Point, x=st.integers(), when=st.datetimes())
)
_any_values = st.recursive(
    _odd_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.frozensets(st.integers() | st.text(max_size=3), max_size=4)
        | st.dictionaries(st.text(max_size=5) | st.integers(), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(_any_values)
def test_to_jsonable_output_is_always_strict_json(value: Any) -> None:
    converted = to_jsonable(value)
    text = json.dumps(converted, allow_nan=False)
    # Converting is idempotent: the output is already plain JSON data.
    assert json.loads(text) == converted
    assert to_jsonable(converted) == converted


@settings(max_examples=150, deadline=None)
@given(_json_values)
def test_to_jsonable_leaves_json_data_unchanged(value: Any) -> None:
    assert to_jsonable(value) == value


def test_execution_accepts_plain_status_string() -> None:
    execution = Execution(status="failed")  # type: ignore[arg-type]
    assert execution.status is EventStatus.FAILED
    assert execution.to_dict()["status"] == "failed"
