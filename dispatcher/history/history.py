"""A branch's record: the ordered messages and event records, in memory and in Redis.

One call's event records and its ActionRequest/ActionResponse pair form a *unit*; a unit is
written whole (C5): Redis receives units in one MULTI/EXEC, and memory receives them in the
same step as the Redis write is queued (no await between), so no reader ever sees an event
without its linked pair, and memory is always what Redis holds plus the units still queued
for it: what a broker that lost the history gets back (durable.DurableLog.restore).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis.asyncio as aioredis
from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError

from toolfleet.dispatcher.accept.context import new_call_id
from toolfleet.dispatcher.history.compact import CompactList
from toolfleet.dispatcher.history.durable import Chunk, DurableLog, Progress
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.messages import (
    ActionRequest,
    ActionRequestContent,
    ActionResponse,
    ActionResponseContent,
    Message,
)
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.serialize import to_jsonable

__all__ = ["BranchHistory", "CallReturn", "Unit", "link_pair", "load_records"]

log = logging.getLogger(__name__)

_MESSAGE = TypeAdapter[Message](Message)


@dataclass(slots=True)
class Unit:
    """Everything one call leaves behind, written at once and in input order."""

    call_id: str | None
    events: list[EventRecord]
    request: ActionRequest
    response: ActionResponse
    result: ActionResponseModel
    # Raised to the caller after the unit is written (suppress_errors=False), else None.
    raise_after: BaseException | None = None
    # TOOL_POST or TOOL_ERROR payload, emitted just before the unit is written.
    hook_point: str | None = None
    hook_payload: dict[str, Any] = field(default_factory=dict)

    def kept(self) -> CallReturn:
        """What act() holds on to until it returns: not the history, to bound memory."""
        return CallReturn(self.result, self.raise_after)


@dataclass(frozen=True, slots=True)
class CallReturn:
    """One call's part of act()'s return value: its result, or the error to raise."""

    result: ActionResponseModel
    raise_after: BaseException | None = None


def link_pair(
    *,
    function: str,
    arguments: dict[str, Any],
    output: Any,
    error: str | None,
    branch_id: str | None,
    call_id: str | None = None,
    tool_call_id: str | None = None,
    request: ActionRequest | None = None,
    requested_at: datetime | None = None,
) -> tuple[ActionRequest, ActionResponse]:
    """An ActionRequest and its ActionResponse, each naming the other's id (C1, C2).

    A caller's own ``request`` is the one kept (its id stays; its content is set to what
    history records: redacted arguments, the call's ids, the response link). A new request
    is dated ``requested_at`` (when the call was made), else now.
    """
    content = ActionRequestContent(
        function=function, arguments=arguments, tool_call_id=tool_call_id, call_id=call_id
    )
    if request is None:
        request = ActionRequest(
            id=new_call_id(), sender=branch_id, recipient=function, content=content
        )
        if requested_at is not None:
            request.created_at = requested_at
    else:
        request.content = content
        request.sender = request.sender or branch_id
        request.recipient = request.recipient or function
    response = ActionResponse(
        id=new_call_id(),
        sender=function,
        recipient=branch_id,
        content=ActionResponseContent(
            function=function,
            arguments=arguments,
            output=output,
            action_request_id=request.id,
            error=error,
            tool_call_id=tool_call_id,
            call_id=call_id,
        ),
    )
    request.content.action_response_id = response.id
    return request, response


class BranchHistory:
    """Appends units to a branch's lists in Redis and in memory."""

    def __init__(self, branch_id: str) -> None:
        self.branch_id = branch_id
        # Compact, to bound memory: the newest items as objects, older ones compressed JSON lines.
        self.messages: CompactList[Message] = CompactList(_message_json, _MESSAGE.validate_json)
        self.events: CompactList[EventRecord] = CompactList(_event_json, _event_record)
        # Redis writes not yet applied (a broker outage), retried in order.
        self.durable = DurableLog(branch_id)
        self.durable.in_redis = self._in_redis

    def _in_redis(self) -> tuple[list[str], list[str]]:
        """The JSON lines Redis should hold: memory less the units still queued for it."""
        queued_events, queued_messages = self.durable.backlog_lines()
        return (
            self.events.lines(len(self.events) - queued_events),
            self.messages.lines(len(self.messages) - queued_messages),
        )

    async def write(
        self,
        client: aioredis.Redis | None,
        keys: Keys,
        units: Sequence[Unit],
        *,
        record_ttl_s: int,
        progress: Progress | tuple[str, int, int] | None = None,
    ) -> str | None:
        """Write ``units`` in order; returns the Redis error text while some are unwritten.

        Memory is written either way, so the caller's history is never missing a unit. A
        Redis write that fails is kept and retried in order (toolfleet.dispatcher.history.durable);
        pass ``progress`` (the batch's written-count key, before, after) to make it exactly once.
        """
        if not units:
            return None
        events = [e for u in units for e in u.events]
        messages = [m for u in units for m in (u.request, u.response)]
        if client is None:
            self.events.extend(events)
            self.messages.extend(messages)
            return None
        encoded_events = [_event_json(e) for e in events]
        encoded_messages = [_message_json(m) for m in messages]
        chunk = Chunk(
            events=encoded_events,
            messages=encoded_messages,
            units=len(units),
            first_call_id=units[0].call_id,
            progress=progress,
        )
        # Memory first, in the same step as the chunk joins the backlog (durable.write queues
        # it before its first await): memory = Redis + backlog at every await. The Redis lines
        # are the compact form too: folding them costs no second encoding.
        self.events.extend(events, encoded_events)
        self.messages.extend(messages, encoded_messages)
        return await self.durable.write(client, keys, chunk, record_ttl_s)


def _event_json(event: EventRecord) -> str:
    # Total, even on bad input: whatever a record holds, its history line is written.
    data = event.to_dict()
    try:
        return json.dumps(data, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return json.dumps(to_jsonable(data))


def _event_record(line: str) -> EventRecord:
    return EventRecord.from_dict(json.loads(line))


def _message_json(message: Message) -> str:
    try:
        return message.model_dump_json()
    except (PydanticSerializationError, ValueError):
        # e.g. a lone surrogate: json.dumps spells it \udXXX where pydantic refuses it.
        return json.dumps(to_jsonable(message.model_dump(mode="python")))


async def load_records(
    client: aioredis.Redis, keys: Keys, branch_id: str
) -> tuple[list[Message], list[EventRecord]]:
    """The messages and event records stored for ``branch_id``, in written order."""
    async with client.pipeline(transaction=True) as pipe:
        pipe.lrange(keys.history(branch_id), 0, -1)
        pipe.lrange(keys.events(branch_id), 0, -1)
        raw_messages, raw_events = await pipe.execute()
    messages = [_MESSAGE.validate_json(raw) for raw in raw_messages]
    events = [_event_record(raw) for raw in raw_events]
    await _attach_late_results(client, keys, events)
    return messages, events


async def _attach_late_results(
    client: aioredis.Redis, keys: Keys, events: list[EventRecord]
) -> None:
    """A sync call stopped while it ran gets its worker's own record of the run (kept under
    ``Keys.late``) as ``late_result``: whether it then completed."""
    stopped = [e for e in events if e.stopped_while_running and e.call_id]
    if not stopped:
        return
    raws = await client.mget([keys.late(str(e.call_id)) for e in stopped])
    for event, raw in zip(stopped, raws, strict=True):
        if raw is not None:
            late = json.loads(raw)
            # Assigning marks the field set, so to_dict() includes it.
            event.late_result = {
                "execution": late["event"]["execution"],
                "worker": late["worker"],
            }
