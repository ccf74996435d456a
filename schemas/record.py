"""A call's event record: what a worker stores as its terminal record (``CallResult.event``),
what the dispatcher writes into a branch's history and what observers receive.

The record is JSON. Its stored form holds ``id``, ``created_at``, ``execution``, ``function``,
``arguments`` and ``tool_call_id``; its history form adds where the call ran (``call_id``,
``branch_id``, ``attempt``, ``worker``, and ``batch_id`` when recovered). A key is written only
when it was given, so a record read and written again keeps its exact shape, and keys this
version does not know are kept.

:meth:`EventRecord.not_run` is the one way to build the record of a call whose tool never ran,
or was stopped, or was lost (unknown tool, refusal, revoke, cancellation, deadline, a lost
worker or dispatcher); :func:`not_run_result` wraps it in the call's terminal ``CallResult``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ConfigDict, field_validator

from toolfleet.schemas.contract import safe_text
from toolfleet.schemas.execution import Execution
from toolfleet.schemas.function_calling import REDACTED, redact
from toolfleet.schemas.model import ToolfleetModel
from toolfleet.schemas.serialize import jsonable_key, to_jsonable
from toolfleet.schemas.status import EventStatus, check_status
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage, CallResult

__all__ = [
    "ARGUMENTS_PREVIEW_BYTES",
    "PREVIEW_KEY",
    "SIZE_KEY",
    "EventRecord",
    "bounded_arguments",
    "not_run_result",
    "shown_arguments",
]

# A refused call's records keep at most this much of its arguments: a 2 MB payload refused
# as oversized must not be stored, returned and rendered whole everywhere it is recorded.
ARGUMENTS_PREVIEW_BYTES = 1024
# The keys of an arguments preview (dotted, so no parameter name collides with them).
PREVIEW_KEY = "toolfleet.preview"
SIZE_KEY = "toolfleet.size_bytes"


def shown_arguments(
    arguments: Mapping[Any, Any], secret_args: Collection[str] | None
) -> dict[str, Any]:
    """``arguments`` as records and history show them: JSON keys and values, the value of each
    secret argument replaced by ``***``. ``secret_args=None`` means no tool is known, so no
    list of secrets: the names are kept and every value is hidden."""
    if secret_args is None:
        hidden = dict.fromkeys(arguments, REDACTED)
    else:
        hidden = redact(arguments, frozenset(secret_args))
    return {jsonable_key(key): to_jsonable(value) for key, value in hidden.items()}


def bounded_arguments(arguments: Any, secret_args: Collection[str] | None = ()) -> dict[str, Any]:
    """``arguments`` as a refused call's records keep them: the (already redacted) dict itself
    when its JSON is at most :data:`ARGUMENTS_PREVIEW_BYTES`; otherwise, or when the model
    sent text that is not a JSON object, ``{PREVIEW_KEY: the first 1 KB of that text,
    SIZE_KEY: its full size in bytes}``. Text that cannot be redacted (the tool has secret
    arguments, or is unknown: ``secret_args`` None) is previewed as ``***``."""
    if isinstance(arguments, Mapping):
        if _surely_small(arguments) or arguments.keys() == {PREVIEW_KEY, SIZE_KEY}:
            return dict(arguments)  # small, or a preview already
        text = json.dumps(to_jsonable(dict(arguments)), ensure_ascii=False)
        if len(text) <= ARGUMENTS_PREVIEW_BYTES:  # characters ≤ bytes: a cheap first test
            size = len(text.encode())
            if size <= ARGUMENTS_PREVIEW_BYTES:
                return dict(arguments)
        redactable = True
    else:
        text = arguments if isinstance(arguments, str) else safe_text(repr(arguments))
        redactable = secret_args is not None and not secret_args
    encoded = text.encode()
    preview = encoded[:ARGUMENTS_PREVIEW_BYTES].decode(errors="ignore")
    return {PREVIEW_KEY: preview if redactable else REDACTED, SIZE_KEY: len(encoded)}


def _surely_small(arguments: Mapping[Any, Any]) -> bool:
    """True when ``arguments`` cannot exceed the preview size as JSON, without encoding them
    (the journal asks this of every call): short strings, small scalars, and small lists and
    dicts of those, two levels deep at most."""
    # JSON escaping writes one character as at most 6 (\uXXXX), 6 bytes of UTF-8 at most.
    budget = ARGUMENTS_PREVIEW_BYTES // 6
    return _chars_within(arguments, budget, depth=2) is not None


def _chars_within(value: Any, budget: int, depth: int) -> int | None:
    """An upper bound on the characters of ``value``'s JSON if it is at most ``budget``, else
    None (also for anything it does not judge cheaply)."""
    if isinstance(value, str):
        used = len(value) + 2
    elif value is None or isinstance(value, bool | float):
        used = 24
    elif isinstance(value, int):
        used = 24 if value.bit_length() < 64 else budget + 1
    elif depth > 0 and isinstance(value, Mapping | list | tuple):
        used = 2
        items = value.items() if isinstance(value, Mapping) else ((None, v) for v in value)
        for key, item in items:
            if key is not None:
                if not isinstance(key, str):
                    return None
                used += len(key) + 4
            inner = _chars_within(item, budget - used, depth - 1)
            if inner is None:
                return None
            used += inner + 1
            if used > budget:
                return None
    else:
        return None
    return used if used <= budget else None


class EventRecord(ToolfleetModel):
    """One execution record of one call (ADR-0012 D1), as JSON-ready fields.

    Build one with :meth:`not_run` or read one with :meth:`from_dict`; :meth:`to_dict` gives
    back exactly the keys that were set, in the order below, then any unknown keys.
    """

    model_config = ConfigDict(extra="allow")

    id: str | None = None
    created_at: str | None = None
    # Execution.to_dict(): status, duration (seconds), response, error, retryable.
    execution: dict[str, Any]
    function: str | None = None
    # Secret values already replaced (shown_arguments).
    arguments: Any = None
    tool_call_id: str | None = None
    # -- where the call ran: set in the history form (in_history) -------------------
    call_id: str | None = None
    branch_id: str | None = None
    attempt: int | None = None
    worker: str | None = None
    batch_id: str | None = None
    # -- a sync call the dispatcher stopped (cancel, deadline) while it ran --
    # The worker it was running on; a sync call cannot be stopped there, so it ran on.
    stopped_while_running: str | None = None
    # That run's own outcome (the worker's record, kept beside the dispatcher's), attached
    # when the branch is loaded: execution (status, response, error, ...) and worker.
    late_result: dict[str, Any] | None = None
    # -- a call parked for approval: the decision (decision, by, at, reason, requested_at,
    # asked_because), toolfleet.schemas.approval.ApprovalRequest.decision().
    approval: dict[str, Any] | None = None

    @field_validator("execution")
    @classmethod
    def _has_status(cls, execution: dict[str, Any]) -> dict[str, Any]:
        check_status(execution)
        return execution

    @classmethod
    def not_run(
        cls,
        function: str,
        arguments: Mapping[Any, Any],
        error: BaseException,
        *,
        status: EventStatus = EventStatus.FAILED,
        secret_args: Collection[str] | None,
        tool_call_id: str | None = None,
        duration_s: float | None = 0.0,
    ) -> EventRecord:
        """The record of a call whose tool never ran, was stopped or was lost.

        ``error`` is what stopped it and ``status`` how it ended (FAILED, CANCELLED, ABORTED).
        ``secret_args`` are the tool's secret argument names, or None when the tool is not
        known (every value is then hidden). ``duration_s`` is 0.0 for a call a worker or the
        dispatcher settled, None for one aborted before it was enqueued (C3).
        """
        execution = Execution(duration=duration_s, status=status)
        execution.add_error(error)
        return cls(
            id=str(uuid.uuid4()),
            created_at=datetime.now(UTC).isoformat(),
            execution=execution.to_dict(),
            function=safe_text(function),
            arguments=shown_arguments(arguments, secret_args),
            tool_call_id=tool_call_id,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EventRecord:
        """Read a stored or history record (raises pydantic's ValidationError when its
        ``execution`` is missing or has no valid status)."""
        return cls.model_validate(dict(data))

    def in_history(
        self,
        *,
        call_id: str | None,
        tool_call_id: str | None,
        branch_id: str | None,
        attempt: int | None,
        worker: str | None,
        batch_id: str | None = None,
    ) -> EventRecord:
        """This record as a branch's history keeps it: with the call's ids and where it ran
        (``batch_id`` only when given: a recovered batch names itself)."""
        update: dict[str, Any] = {
            "call_id": call_id,
            "tool_call_id": tool_call_id,
            "branch_id": branch_id,
            "attempt": attempt,
            "worker": worker,
        }
        if batch_id is not None:
            update["batch_id"] = batch_id
        return self.model_copy(update=update)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored and written to history: the keys that were set."""
        return self.model_dump(exclude_unset=True)

    @property
    def status(self) -> EventStatus:
        return EventStatus(self.execution["status"])

    @property
    def duration_s(self) -> float | None:
        duration = self.execution.get("duration")
        return float(duration) if isinstance(duration, int | float) else None


def not_run_result(
    message: CallMessage,
    tool: Tool | None,
    error: BaseException,
    *,
    status: EventStatus = EventStatus.FAILED,
    worker: str | None = None,
) -> CallResult:
    """The terminal record of ``message``'s call when its tool never ran, was stopped or was
    lost: :meth:`EventRecord.not_run` placed in a ``CallResult``. ``tool`` (None when the
    registry does not know it) decides which argument values are hidden."""
    record = EventRecord.not_run(
        message.function,
        message.arguments,
        error,
        status=status,
        secret_args=tool.secret_args if tool is not None else None,
        tool_call_id=message.tool_call_id,
    )
    return CallResult(
        call_id=message.call_id,
        function=safe_text(message.function),
        event=record.to_dict(),
        attempt=message.attempt,
        worker=worker,
        batch_id=message.batch_id,
    )
