"""Per-call task events for the calls of a bundle message, so Flower shows each call (C10).

Celery sends task events for the message it runs: for ``toolfleet.execute_many`` that is one
``bundle:<function>:<n>`` task. Each call inside gets its own events here, with the call's task
id (:func:`toolfleet.schemas.tasks.task_id_for`, the call_id) as ``uuid`` and ``tool:<function>`` as
name — what a single ``toolfleet.execute`` message shows: task-received and task-started as the call
begins, then task-succeeded, task-failed or task-revoked with its outcome. Arguments are shown
redacted (the tool's ``secret_args`` as ``***``; every value when the tool is unknown).

Sent only while a monitor watches (:func:`toolfleet.workers.monitor.is_watched`, or
``TOOLFLEET_TASK_EVENTS=always``): unwatched, a bundle pays nothing for them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from celery import Celery
from kombu.utils.encoding import safe_repr

from toolfleet.schemas.function_calling import REDACTED, redact
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tasks import task_id_for
from toolfleet.schemas.wire import CallMessage, CallResult
from toolfleet.workers.monitor import is_watched
from toolfleet.workers.registry import Registry

__all__ = ["CallEvents", "call_events"]

log = logging.getLogger(__name__)

# As Celery's own task events: long reprs are cut (Flower shows them in a table).
_REPR_MAX_CHARS = 1024


class CallEvents:
    """Sends one bundle's per-call events through one event dispatcher."""

    def __init__(self, dispatcher: Any, registry: Registry) -> None:
        self._dispatcher = dispatcher
        self._registry = registry
        self._started_at: dict[str, float] = {}

    def started(self, msg: CallMessage) -> None:
        uuid = task_id_for(msg)
        self._send(
            "task-received",
            uuid=uuid,
            name=f"tool:{msg.function}",
            args=self._argsrepr(msg),
            kwargs="{}",
            retries=msg.attempt,
            eta=None,
            expires=None,
            root_id=uuid,
            parent_id=None,
        )
        self._started_at[uuid] = time.monotonic()
        self._send("task-started", uuid=uuid)  # the dispatcher adds its pid

    def finished(self, msg: CallMessage, result: CallResult, error: BaseException | None) -> None:
        uuid = task_id_for(msg)
        runtime_s = time.monotonic() - self._started_at.pop(uuid, time.monotonic())
        if result.status is EventStatus.CANCELLED:
            self._send("task-revoked", uuid=uuid, terminated=False, signum=None, expired=False)
        elif result.status is EventStatus.FAILED:
            self._send(
                "task-failed",
                uuid=uuid,
                exception=safe_repr(error or result.execution.get("error"), _REPR_MAX_CHARS),
                traceback="",
                runtime=runtime_s,
            )
        else:
            shown = {"call_id": result.call_id, "status": result.status.value}
            self._send(
                "task-succeeded",
                uuid=uuid,
                result=safe_repr(shown, _REPR_MAX_CHARS),
                runtime=runtime_s,
            )

    def _argsrepr(self, msg: CallMessage) -> str:
        if msg.function in self._registry:
            arguments = redact(msg.arguments, self._registry.get(msg.function).secret_args)
        else:
            arguments = dict.fromkeys(msg.arguments, REDACTED)
        shown = {
            "call_id": msg.call_id,
            "branch_id": msg.branch_id,
            "function": msg.function,
            "tool_call_id": msg.tool_call_id,
            "arguments": arguments,
        }
        return safe_repr((shown,), _REPR_MAX_CHARS)

    def _send(self, event_type: str, **fields: Any) -> None:
        try:
            self._dispatcher.send(event_type, **fields)
        except Exception as exc:  # monitoring must never fail a call
            log.warning("could not send %s for %s: %s", event_type, fields.get("uuid"), exc)


@contextlib.contextmanager
def call_events(
    app: Celery, hostname: str | None, registry: Registry
) -> Iterator[CallEvents | None]:
    """A bundle's CallEvents while a monitor watches ``app``'s fleet, else None."""
    if not is_watched(app):
        yield None
        return
    with app.events.default_dispatcher(hostname=hostname) as dispatcher:
        yield CallEvents(dispatcher, registry)
