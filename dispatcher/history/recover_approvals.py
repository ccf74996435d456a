"""What ``toolfleet recover`` does with the calls of a dead dispatcher that were parked for
approval (``toolfleet.dispatcher.govern.approvals``).

A parked call stays decidable after its dispatcher is gone: recovery keeps waiting for the
decision, like for a call still running. Approved, it is enqueued from the message stored
with it (a second copy, if the dead dispatcher had sent one, is a no-op: C7); denied or
expired, it ends as the same refusal a live dispatcher writes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.approvals import approval_hashes, expire
from toolfleet.schemas.approval import ApprovalRequest, parked_message
from toolfleet.schemas.errors import ApprovalDeniedError
from toolfleet.schemas.record import not_run_result
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tasks import EXECUTE_TASK, task_id_for
from toolfleet.schemas.wire import CallMessage, CallResult

__all__ = [
    "ParkedCall",
    "expire_parked",
    "parked_calls",
    "refresh_parked",
    "refusal_result",
    "send_approved",
]


class ParkedCall:
    """A call of the batch that was parked for approval, and what recovery did with it."""

    __slots__ = ("message", "request", "route", "sent")

    def __init__(self, request: ApprovalRequest, message: str, route: dict[str, Any]) -> None:
        self.request = request
        self.message = message
        self.route = route
        self.sent = False


async def parked_calls(fleet: Fleet, call_ids: list[str]) -> dict[str, ParkedCall]:
    """The calls among ``call_ids`` that were parked for approval, as Redis holds them now."""
    found = await approval_hashes(fleet.redis, fleet.keys, call_ids)
    parked: dict[str, ParkedCall] = {}
    for call_id, raw in zip(call_ids, found, strict=True):
        if raw:
            message, route = parked_message(raw)
            parked[call_id] = ParkedCall(ApprovalRequest.from_fields(raw), message, route)
    return parked


async def refresh_parked(fleet: Fleet, parked: dict[str, ParkedCall], call_ids: list[str]) -> None:
    """Read again the decisions of the parked calls among ``call_ids``."""
    ids = [call_id for call_id in call_ids if call_id in parked]
    for call_id, now in (await parked_calls(fleet, ids)).items():
        parked[call_id].request = now.request


async def send_approved(fleet: Fleet, parked: ParkedCall) -> None:
    """Enqueue an approved call from its stored message and route (queue, send options)."""
    message = CallMessage.model_validate_json(parked.message)
    options = dict(parked.route.get("options") or {})

    def send() -> None:
        fleet.app.send_task(
            EXECUTE_TASK,
            args=(message.model_dump(mode="json"),),
            task_id=task_id_for(message),
            queue=parked.route["queue"],
            **options,
        )

    await asyncio.get_running_loop().run_in_executor(None, send)
    parked.sent = True


async def expire_parked(fleet: Fleet, parked: ParkedCall, why: str) -> ApprovalRequest:
    """End a call that still waits when recovery stops waiting; a decision that lands first
    stands."""
    return await expire(fleet.redis, fleet.keys, parked.request, by="recover", why=why)


def refusal_result(message: CallMessage, request: ApprovalRequest) -> CallResult:
    """The SKIPPED record of a call that was denied, or expired, while parked."""
    result = not_run_result(
        message, None, ApprovalDeniedError(request.refusal_text()), status=EventStatus.SKIPPED
    )
    result.event["approval"] = request.decision()
    return result
