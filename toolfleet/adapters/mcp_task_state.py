"""What a task is now, read from its call's truth in Redis: any replica answers the same.

The order of the evidence: the end the creating process recorded (its rendered result); the
call's terminal record (``Keys.event``, written by the worker or by C9 cancellation); the call's
approval hash (waiting: ``input_required``; denied or expired: a completed task whose result is
the model-readable refusal); otherwise the call is queued or running: ``working``, with the last
progress message.

A call that was approved after the process that parked it died (its dispatcher key expired) is
enqueued here from the message stored with it, once per task, as ``toolfleet recover`` would:
a second copy is a no-op on the workers (C7).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import mcp_types as types

from toolfleet.adapters.mcp_task_progress import progress_text
from toolfleet.adapters.mcp_task_store import TaskRecord, TaskStore
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.history.recover_approvals import parked_calls, send_approved
from toolfleet.dispatcher.watch.cancel import settle_calls
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.approval import ApprovalRequest
from toolfleet.schemas.progress import decode, is_progress
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallMessage, CallResult

__all__ = [
    "POLL_INTERVAL_MS",
    "approval_key",
    "approval_request",
    "cancel_orphan",
    "iso",
    "on_the_fleet",
    "task_view",
]

log = logging.getLogger(__name__)

# What a client is asked to wait between two tasks/get (a call is rarely done sooner).
POLL_INTERVAL_MS = 500
# How many of a dead creator's reply-list entries are read for a call's last progress.
ORPHAN_PROGRESS_SCAN = 200

Render = Callable[[ActionResponseModel, str], types.CallToolResult]


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat().replace("+00:00", "Z")


def approval_key(call_id: str) -> str:
    """The inputRequests key of a call's approval: one per call, so unique in its task."""
    return f"approval-{call_id}"


def approval_request(request: ApprovalRequest) -> dict[str, Any]:
    """The elicitation that asks the person whether the parked call may run."""
    why = f" ({request.reason})" if request.reason else ""
    arguments = json.dumps(request.arguments, ensure_ascii=False)[:1000]
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": f"Approve the call of tool {request.tool!r} with {arguments}?{why}",
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "approve": {
                        "type": "boolean",
                        "title": "Approve",
                        "description": "true runs the call; false refuses it",
                    },
                    "reason": {
                        "type": "string",
                        "title": "Reason",
                        "description": "why (the model reads it when the call is refused)",
                    },
                },
                "required": ["approve"],
            },
        },
    }


async def task_view(
    fleet: Fleet, store: TaskStore, record: TaskRecord, render: Render
) -> dict[str, Any]:
    """The task as ``tasks/get`` and ``notifications/tasks`` carry it (a DetailedTask)."""
    base: dict[str, Any] = {
        "taskId": record.task_id,
        "createdAt": iso(record.created_at),
        "lastUpdatedAt": iso(record.updated_at),
        "ttlMs": record.ttl_ms,
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    if record.final_status is not None:
        return _ended(base, record.final_status, record.result, record.status_message)
    raw = await fleet.redis.get(fleet.keys.event(record.call_id))
    if raw is not None:
        return _from_record(base, CallResult.model_validate_json(raw), record, render)
    parked = (await parked_calls(fleet, [record.call_id])).get(record.call_id)
    if parked is not None:
        request = parked.request
        if request.waiting:
            message = f"waiting for approval: {request.reason}" if request.reason else None
            return {
                **base,
                "status": "input_required",
                **({"statusMessage": message} if message else {}),
                "inputRequests": {approval_key(record.call_id): approval_request(request)},
            }
        if request.state == "expired" and request.decided_by == "cancel":
            return _ended(base, "cancelled", None, "cancelled while it waited for approval")
        if request.state != "approved":
            refusal = render(
                ActionResponseModel(
                    function=record.function,
                    status=EventStatus.SKIPPED,
                    error=request.refusal_text(),
                    call_id=record.call_id,
                ),
                record.branch_id,
            )
            return _ended(base, "completed", _dump(refusal), request.refusal_text())
        if not await _creator_alive(fleet, record):
            await _send_once(fleet, store, record, parked)
    elif record.cancel_requested:
        await cancel_orphan(fleet, record)  # once its creator is gone, no act() will
    working: dict[str, Any] = {**base, "status": "working"}
    message = record.status_message
    if not await _creator_alive(fleet, record):
        message = await _orphan_progress(fleet, record) or message
    if message:
        working["statusMessage"] = message
    return working


async def _orphan_progress(fleet: Fleet, record: TaskRecord) -> str | None:
    """The call's last progress report on the reply list of its dead creator, which nobody
    pops any more (its newest ORPHAN_PROGRESS_SCAN entries)."""
    entries = await fleet.redis.lrange(
        fleet.keys.reply(record.dispatcher_id), -ORPHAN_PROGRESS_SCAN, -1
    )
    for raw in reversed(entries):
        if is_progress(raw):
            report = decode(raw)
            if report is not None and report.call_id == record.call_id:
                return progress_text(report)
    return None


def _ended(
    base: dict[str, Any], status: str, result: dict[str, Any] | None, message: str | None
) -> dict[str, Any]:
    view: dict[str, Any] = {**base, "status": status}
    if message:
        view["statusMessage"] = message
    if status == "completed":
        view["result"] = result or {"content": [], "isError": False}
    elif status == "failed":
        view["error"] = result or {"code": -32603, "message": message or "internal error"}
    return view


def _from_record(
    base: dict[str, Any], found: CallResult, record: TaskRecord, render: Render
) -> dict[str, Any]:
    execution = found.execution
    status = EventStatus(execution["status"])
    error = execution.get("error")
    if status is EventStatus.CANCELLED:
        return _ended(base, "cancelled", None, str(error) if error else "cancelled")
    result = ActionResponseModel(
        function=found.function,
        output=execution.get("response"),
        status=status,
        error=str(error) if error is not None else None,
        call_id=found.call_id,
    )
    return _ended(base, "completed", _dump(render(result, record.branch_id)), None)


def _dump(result: types.CallToolResult) -> dict[str, Any]:
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def _creator_alive(fleet: Fleet, record: TaskRecord) -> bool:
    return await TaskStore(fleet.redis, fleet.keys).creator_alive(record.dispatcher_id)


async def _send_once(fleet: Fleet, store: TaskStore, record: TaskRecord, parked: Any) -> None:
    """Enqueue an approved call whose parking process is gone; once per task."""
    claimed = await fleet.redis.hsetnx(store.key(record.task_id), "resent", "1")
    if not claimed:
        return
    log.info("task of call %s: approved after its process ended; enqueued here", record.call_id)
    await send_approved(fleet, parked)


async def cancel_orphan(fleet: Fleet, record: TaskRecord) -> None:
    """C9 for a task whose creating process is gone: no act() is left to cancel, so the call
    is recorded CANCELLED here unless a worker recorded its end first, revoked if queued, and
    cancelled on its worker if it is a running async call (a running sync call runs on, and
    its record says so). A call parked for approval is the caller's to expire."""
    if await _creator_alive(fleet, record) or await fleet.redis.exists(
        fleet.keys.event(record.call_id), fleet.keys.approval(record.call_id)
    ):
        return
    message = CallMessage(
        call_id=record.call_id, function=record.function, branch_id=record.branch_id
    )
    tool = fleet.registry.get(record.function) if record.function in fleet.registry else None
    await settle_calls(
        fleet,
        [(message, tool)],
        lambda m: asyncio.CancelledError(
            f"call {m.call_id} of tool {m.function!r} was cancelled through tasks/cancel"
        ),
        EventStatus.CANCELLED,
    )


# A call's record with one of these statuses was written without the call being sent.
_REFUSED_BEFORE_SENDING = frozenset({EventStatus.SKIPPED.value, EventStatus.ABORTED.value})


async def on_the_fleet(fleet: Fleet, record: TaskRecord, *, past_pre_hooks: bool) -> bool:
    """Whether the task's call is durably on the fleet: parked for approval, recorded by a
    worker, or listed in its open batch's journal (``past_pre_hooks``: it passed its gate and
    TOOL_PRE hooks in this process)."""
    client, keys = fleet.redis, fleet.keys
    call_id = record.call_id
    async with client.pipeline(transaction=False) as pipe:
        pipe.exists(keys.approval(call_id))
        pipe.get(keys.event(call_id))
        parked, event = await pipe.execute()
    if parked:
        return True
    if event is not None:
        # A call refused before it was sent (a gate's denial, a bad argument) has its record
        # too, written a moment before its act() returns: it never reached the fleet.
        status = CallResult.model_validate_json(event).execution.get("status")
        return status not in _REFUSED_BEFORE_SENDING
    if not past_pre_hooks:
        # The batch journal is written before a refusal's record too: only a call that passed
        # the gate and the TOOL_PRE hooks can be on the fleet by its journal.
        return False
    batches = await client.hgetall(keys.open_batches())
    ours = [_str(b) for b, branch in batches.items() if _str(branch) == record.branch_id]
    for raw in await client.mget([keys.batch(b) for b in ours]) if ours else []:
        if raw is not None and call_id in _str(raw):  # the journal lists its call ids
            return True
    return False


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
