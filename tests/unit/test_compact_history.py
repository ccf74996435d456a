"""The branch's compact in-memory history: older items folded, same values back."""

from __future__ import annotations

import json

import pytest

from toolfleet.dispatcher.history.compact import CompactList
from toolfleet.dispatcher.history.history import _MESSAGE, _message_json
from toolfleet.schemas.messages import ActionRequest, ActionRequestContent


def _request(i: int) -> ActionRequest:
    content = ActionRequestContent(function="echo", arguments={"value": i, "text": "line\nbreak"})
    return ActionRequest(sender="branch", recipient="echo", content=content)


def test_folded_items_read_back_equal_and_the_newest_stay_the_objects_written() -> None:
    history: CompactList[ActionRequest] = CompactList(
        _message_json, _MESSAGE.validate_json, live_items=4, block_items=3
    )
    written = [_request(i) for i in range(20)]
    for i, message in enumerate(written):
        # Half arrive with their Redis line already made, half are encoded when folded.
        history.append(message, _message_json(message) if i % 2 else None)
    assert len(history) == 20
    assert history._blocks, "older items were folded"
    assert list(history) == written
    assert history == written and written == history
    assert [m.id for m in history[2:17:5]] == [m.id for m in written[2:17:5]]
    assert history[-1] is written[-1]  # the newest are the caller's own objects
    assert history[0] == written[0] and history[0] is not written[0]  # decoded copy
    assert history[-20].content.arguments == {"value": 0, "text": "line\nbreak"}


def test_events_fold_as_json_and_compare_like_lists() -> None:
    events: CompactList[dict[str, object]] = CompactList(
        json.dumps, json.loads, live_items=2, block_items=2
    )
    assert events == [] and not events
    records = [{"n": i, "status": "completed"} for i in range(9)]
    events.extend(records)
    assert events == records
    assert events[4] == {"n": 4, "status": "completed"}
    assert [*events, {"n": 9}] == [*records, {"n": 9}]
    with pytest.raises(IndexError, match="index 9"):
        events[9]


def test_results_share_their_field_names_and_stay_independent() -> None:
    """A 100,000-call act() returns 100,000 results: each must not carry its own name set."""
    import tracemalloc

    from toolfleet.schemas.action import ActionResponseModel
    from toolfleet.schemas.status import EventStatus

    def result(i: int) -> ActionResponseModel:
        return ActionResponseModel(
            function="echo",
            arguments={"value": i},
            output=i,
            status=EventStatus.COMPLETED,
            error=None,
            call_id=f"call-{i}",
            tool_call_id=f"call-{i}",
        )

    first, second = result(1), result(2)
    assert first.model_fields_set is second.model_fields_set
    first.output = "changed"
    assert second.output == 2 and second.model_fields_set == set(ActionResponseModel.model_fields)
    partial = ActionResponseModel(function="echo")
    assert partial.model_fields_set == {"function"}  # only full results share

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [result(i) for i in range(2000)]
        per_result = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert per_result < 1000, per_result  # about 0.8 KB with its strings; 1.5 KB unshared
