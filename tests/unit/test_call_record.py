"""How ``toolfleet run`` sorts a result: the outcome its bar and summary count."""

from __future__ import annotations

from toolfleet.cli.call_record import DENIED_ERROR, classify
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.status import EventStatus


def _response(status: EventStatus, output: object, error: str | None) -> ActionResponseModel:
    return ActionResponseModel(
        function="refund", arguments={}, output=output, status=status, error=error, call_id="c"
    )


def test_a_call_its_approver_denied_counts_as_denied_not_failed() -> None:
    refusal = "call of tool 'refund' was not run: denied by bob: no"
    denied = _response(EventStatus.SKIPPED, {"error": refusal, "function": "refund"}, refusal)
    gate = _response(EventStatus.SKIPPED, {"error": DENIED_ERROR}, DENIED_ERROR)
    failed = _response(EventStatus.FAILED, None, "ValueError: boom")
    done = _response(EventStatus.COMPLETED, "refunded", None)
    assert [classify(r) for r in (denied, gate, failed, done)] == [
        "denied",
        "denied",
        "failed",
        "done",
    ]
