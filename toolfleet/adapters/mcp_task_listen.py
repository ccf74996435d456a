"""``subscriptions/listen`` for tasks: ``notifications/tasks`` pushes on the listen stream.

A client that declares the tasks extension lists ``notifications.taskIds``; the stream is
acknowledged with the ids this caller may see (another caller's, an unknown or an expired id is
left out), then carries a ``notifications/tasks`` (the whole DetailedTask, as ``tasks/get``
would answer) each time one of them changes status or message. The state is read from Redis,
so a stream on any replica follows a task another one runs. The stream ends, with its result,
once every task it follows has ended, or when the client goes away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

from mcp.shared.exceptions import MCPError
from mcp_types import RequestParams
from mcp_types.jsonrpc import INVALID_REQUEST, MISSING_REQUIRED_CLIENT_CAPABILITY
from pydantic import BaseModel, ConfigDict, Field

from toolfleet.adapters.mcp_task_store import TaskRecord

__all__ = ["ListenParams", "listen_to_tasks"]

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
# How often a listen stream reads its tasks' state: the pushes' latency, at most.
WATCH_INTERVAL_S = 0.25
# At most this many tasks per stream.
MAX_TASKS_PER_STREAM = 100
_TERMINAL = frozenset({"completed", "failed", "cancelled"})


class ListenParams(RequestParams):
    """``subscriptions/listen``: the notification kinds asked for, read as given (the SDK's
    model does not know ``taskIds``)."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")
    notifications: dict[str, Any] = Field(default_factory=dict)


class _Notification(BaseModel):
    """A notification the SDK's vocabulary does not have (``notifications/tasks`` and the
    acknowledgement carrying ``taskIds``), sent as given."""

    method: str
    params: dict[str, Any]


async def listen_to_tasks(
    ctx: Any,
    params: ListenParams,
    *,
    declared: bool,
    load: Callable[[str], Awaitable[TaskRecord | None]],
    view: Callable[[TaskRecord], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """Serve one listen stream of task notifications (``load`` gives the caller's task or
    None; ``view`` its DetailedTask)."""
    subscription_id = getattr(ctx, "request_id", None)
    if subscription_id is None:
        raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
    asked = params.notifications.get("taskIds")
    if asked is not None and not declared:
        raise MCPError(
            code=MISSING_REQUIRED_CLIENT_CAPABILITY,
            message="task notifications need the io.modelcontextprotocol/tasks extension "
            "declared in the request's _meta clientCapabilities.extensions",
            data={"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}},
        )
    ids = [str(i) for i in asked or [] if isinstance(i, str)][:MAX_TASKS_PER_STREAM]
    records = {i: r for i in ids if (r := await load(i)) is not None}
    meta = {SUBSCRIPTION_ID: subscription_id}
    await _send(
        ctx,
        "notifications/subscriptions/acknowledged",
        {"notifications": {} if asked is None else {"taskIds": list(records)}, "_meta": meta},
        subscription_id,
    )
    seen: dict[str, tuple[Any, Any]] = {}
    while records:
        for task_id in list(records):
            record = await load(task_id)
            if record is None:  # expired meanwhile: nothing more to say
                records.pop(task_id)
                continue
            detailed = await view(record)
            mark = (detailed.get("status"), detailed.get("statusMessage"))
            if seen.get(task_id) != mark:
                seen[task_id] = mark
                await _send(
                    ctx, "notifications/tasks", {**detailed, "_meta": meta}, subscription_id
                )
            if detailed.get("status") in _TERMINAL:
                records.pop(task_id)
        if records:
            await asyncio.sleep(WATCH_INTERVAL_S)
    return {"resultType": "complete", "_meta": meta}


async def _send(ctx: Any, method: str, params: dict[str, Any], request_id: Any) -> None:
    notification = _Notification(method=method, params=params)
    await ctx.session.send_notification(cast(Any, notification), related_request_id=request_id)
