"""toolfleet.schemas.record.EventRecord: the one typed event record, and its shape on the wire and
in history (stored records and history keep the keys they always had)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from toolfleet.schemas.errors import UnknownToolError
from toolfleet.schemas.record import EventRecord, not_run_result, shown_arguments
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage, CallResult

STORED_KEYS = ["id", "created_at", "execution", "function", "arguments", "tool_call_id"]
HISTORY_KEYS = [*STORED_KEYS, "call_id", "branch_id", "attempt", "worker"]


def _secret_tool() -> Tool:
    def login(user: str, password: str) -> str:
        return user

    return Tool(func_callable=login, secret_args=frozenset({"password"}))


def test_not_run_record_has_the_stored_keys_and_hides_secrets() -> None:
    record = EventRecord.not_run(
        "login",
        {"user": "ann", "password": "hunter2"},
        UnknownToolError("no such tool"),
        secret_args=_secret_tool().secret_args,
        tool_call_id="toolu_1",
    ).to_dict()
    assert list(record) == STORED_KEYS
    assert record["arguments"] == {"user": "ann", "password": "***"}
    assert record["tool_call_id"] == "toolu_1"
    assert record["execution"] == {
        "status": "failed",
        "duration": 0.0,
        "response": None,
        "error": {
            "error": "UnknownToolError",
            "message": "no such tool",
            "module": "toolfleet.schemas.errors",
        },
        "retryable": None,
    }
    assert "hunter2" not in json.dumps(record)


def test_not_run_without_a_tool_keeps_names_and_hides_every_value() -> None:
    record = EventRecord.not_run(
        "nope", {"a": 1, "b": [2]}, RuntimeError("x"), secret_args=None, duration_s=None
    )
    assert record.arguments == {"a": "***", "b": "***"}
    assert record.duration_s is None and record.execution["duration"] is None
    assert record.status is EventStatus.FAILED


def test_history_form_adds_where_the_call_ran_and_batch_only_when_given() -> None:
    stored = EventRecord.not_run(
        "f", {}, asyncio.CancelledError("stop"), status=EventStatus.CANCELLED, secret_args=()
    )
    placed = stored.in_history(
        call_id="c1", tool_call_id="t1", branch_id="b1", attempt=2, worker="w@h"
    ).to_dict()
    assert list(placed) == HISTORY_KEYS
    assert (placed["call_id"], placed["attempt"], placed["worker"]) == ("c1", 2, "w@h")
    recovered = stored.in_history(
        call_id="c1", tool_call_id=None, branch_id="b1", attempt=0, worker=None, batch_id="B"
    ).to_dict()
    assert list(recovered) == [*HISTORY_KEYS, "batch_id"]
    assert recovered["tool_call_id"] is None and recovered["batch_id"] == "B"
    # The stored record itself is unchanged by placing it.
    assert list(stored.to_dict()) == STORED_KEYS


def test_a_record_read_and_written_again_keeps_its_exact_keys() -> None:
    legacy = {
        "created_at": "2026-01-01T00:00:00+00:00",
        "execution": {"status": "completed", "duration": 0.5, "response": 3},
        "function": "add",
        "arguments": {"a": 1},
        "call_id": "c",
        "custom": {"kept": True},
    }
    record = EventRecord.from_dict(legacy)
    assert record.to_dict() == legacy
    assert json.dumps(record.to_dict()) == json.dumps(legacy)
    assert record.status is EventStatus.COMPLETED and record.duration_s == 0.5
    assert record.id is None and record.worker is None


def test_a_record_without_a_valid_status_is_refused_when_read() -> None:
    with pytest.raises(ValidationError, match="not one of"):
        EventRecord.from_dict({"execution": {"status": "exploded"}})
    with pytest.raises(ValidationError):
        EventRecord.from_dict({"id": "x"})


def test_not_run_result_is_a_valid_terminal_record() -> None:
    message = CallMessage(
        call_id="c9",
        tool_call_id="call_9",
        function="login",
        arguments={"user": "ann", "password": "hunter2"},
        attempt=1,
        batch_id="B9",
    )
    result = not_run_result(
        message,
        _secret_tool(),
        asyncio.CancelledError("revoked"),
        status=EventStatus.CANCELLED,
        worker="w1",
    )
    again = CallResult.model_validate_json(result.model_dump_json())
    assert again == result
    assert (again.call_id, again.attempt, again.worker, again.batch_id) == ("c9", 1, "w1", "B9")
    assert again.status is EventStatus.CANCELLED
    assert list(again.event) == STORED_KEYS
    assert again.event["arguments"] == {"user": "ann", "password": "***"}
    assert again.event["tool_call_id"] == "call_9"


def test_shown_arguments_spells_out_keys_and_values_json_can_hold() -> None:
    shown = shown_arguments({1: "one", "s": "\udc80", "n": float("nan")}, secret_args=())
    assert shown == {"1": "one", "s": "\\udc80", "n": "<unserializable>"}
    json.dumps(shown, allow_nan=False)
