"""Flower sees a call while it waits for approval (C10), and sees it end when it is refused.

A parked call is not a Celery task yet, so no producer announces it. The dispatcher sends the
``task-sent`` event Celery's producer would, under the call's task id and named
``tool:<function>``, with one more field, ``approval``: ``"waiting"`` as the call parks, then
``"denied"``, ``"expired"`` or ``"withdrawn"`` when it ends without running. ``toolfleet
flower`` shows these as the states ``AWAITING_APPROVAL`` and ``REVOKED``
(:class:`toolfleet.cli.flower_internals.ToolTask`); a plain Flower shows ``PENDING``. An
approved call goes on as any other: its own ``task-sent`` moves it to ``PENDING``.

Why ``task-sent`` and not ``task-revoked`` for a refusal: Celery's event state takes the sender
of any other task event for the worker that ran the task, so Flower would list the dispatcher
as a worker.

Sent only while a monitor watches, like every other task event. Monitoring never fails a call:
an event that cannot be sent within :data:`_SEND_TIMEOUT_S` is logged and dropped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from celery import Celery
from redis.exceptions import RedisError

from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.send.direct import watched
from toolfleet.dispatcher.send.enqueue import send_options
from toolfleet.schemas.tasks import task_id_for
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage

__all__ = ["announce_approval"]

log = logging.getLogger(__name__)

# A publish on a live broker takes milliseconds; past this the broker is in trouble and the
# call's own path reports it, not the monitor's.
_SEND_TIMEOUT_S = 5.0


async def announce_approval(
    fleet: Fleet, tool: Tool, message: CallMessage, approval: str, reason: str | None
) -> None:
    """Tell a watching Flower where the parked call of ``message`` stands: ``approval`` is
    ``"waiting"``, or how it ended unrun; ``reason`` why approval was asked or refused."""
    try:
        if not await watched(fleet.app, fleet.redis):
            return
    except (RedisError, OSError):
        return  # the broker is away: the call's own path says so
    queue, options = send_options(fleet.settings, message, tool)
    uuid = task_id_for(message)
    fields = {
        "uuid": uuid,
        "root_id": uuid,
        "parent_id": None,
        "name": f"tool:{message.function}",
        "args": options["argsrepr"],
        "kwargs": options["kwargsrepr"],
        "retries": message.attempt,
        "eta": None,
        "expires": None,
        "queue": queue,
        "exchange": "",
        "routing_key": queue,
        "approval": approval,
        "approval_reason": reason,
    }
    loop = asyncio.get_running_loop()
    sending = loop.run_in_executor(fleet.publishing_thread(), _send_sent_event, fleet.app, fields)
    try:
        async with asyncio.timeout(_SEND_TIMEOUT_S):
            await sending
    except Exception as exc:  # monitoring must not fail the call
        log.warning(
            "Flower was not told that call %s is %s: %s: %s",
            uuid,
            approval,
            type(exc).__name__,
            exc,
        )


def _send_sent_event(app: Celery, fields: dict[str, Any]) -> None:
    with app.events.default_dispatcher() as dispatcher:
        dispatcher.send("task-sent", **fields)
