"""What a worker checks before it trusts a message: the dispatcher's checks are not enough.

Anyone who can write to the broker can hand-make a ``toolfleet.execute`` message, so a worker
re-checks what the message claims: the JSON contract and size limit
(:mod:`toolfleet.schemas.contract`), that the tool's kind matches this pool (a sync tool on the
asyncio pool would block every async call behind it), and that ``reply_to`` is a reply list of this
fleet (never a branch's history, a record or another prefix's key). Only toolfleet's own tasks are
registered on its workers, so Celery's built-ins cannot be run by name.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from toolfleet.schemas.contract import check_arguments, safe_repr
from toolfleet.schemas.errors import RefusedCallError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.tasks import TOOLFLEET_TASK_PREFIX
from toolfleet.schemas.tool import Tool, ToolKind
from toolfleet.schemas.wire import CallMessage

__all__ = ["TOOLFLEET_TASK_PREFIX", "check_call", "keep_only_toolfleet_tasks", "reply_to_problem"]

log = logging.getLogger(__name__)


def reply_to_problem(reply_to: str | None, keys: Keys) -> str | None:
    """Why ``reply_to`` is not a reply list of this fleet, or None when it is (or absent)."""
    if reply_to is None:
        return None
    prefix = keys.reply("")
    suffix = reply_to[len(prefix) :] if reply_to.startswith(prefix) else None
    if suffix and ":" not in suffix:
        return None
    return (
        f"reply_to {safe_repr(reply_to)} is not a reply list of this fleet "
        f"({prefix}<collector id>); the call's record is kept under its event key and nothing "
        "was pushed there. Publish calls through toolfleet (the dispatcher or "
        "toolfleet.dispatcher.send.enqueue)"
    )


def check_call(
    msg: CallMessage, tool: Tool, *, pool: ToolKind | None, max_argument_bytes: int
) -> None:
    """Raise RefusedCallError (wrong pool) or the contract's error (bad or oversized
    arguments) before the tool runs. ``pool`` None skips the kind check."""
    if pool is not None and tool.kind != pool:
        raise RefusedCallError(
            f"tool {tool.function!r} is a {tool.kind} tool but its call reached the {pool} "
            f"pool; it was not run (a sync tool would block the asyncio pool's loop). "
            f"Publish calls through toolfleet, which routes {tool.kind} tools to the "
            f"{tool.kind} queue"
        )
    check_arguments(tool.function, msg.arguments, max_bytes=max_argument_bytes)


def keep_only_toolfleet_tasks(app: Celery) -> list[str]:
    """Unregister every task not named ``toolfleet.*`` (Celery's built-ins: accumulate,
    backend_cleanup, chord_unlock, ...); returns the names removed."""
    removed: list[str] = []
    tasks: Any = app.tasks  # finalizes the app: the built-ins are registered by now
    for name in list(tasks):
        if not name.startswith(TOOLFLEET_TASK_PREFIX):
            tasks.unregister(name)
            removed.append(name)
    if removed:
        log.debug("unregistered non-toolfleet tasks: %s", ", ".join(sorted(removed)))
    return removed
