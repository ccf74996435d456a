"""Celery task names and task ids: what a dispatcher publishes and a worker registers."""

from __future__ import annotations

from toolfleet.schemas.wire import CallMessage

__all__ = ["EXECUTE_MANY_TASK", "EXECUTE_TASK", "TOOLFLEET_TASK_PREFIX", "task_id_for"]

# Every toolfleet task is named under this prefix; a worker registers nothing else.
TOOLFLEET_TASK_PREFIX = "toolfleet."
# One CallMessage per Celery message.
EXECUTE_TASK = "toolfleet.execute"
# A list of CallMessages per Celery message (opt-in batching of trivial tools).
EXECUTE_MANY_TASK = "toolfleet.execute_many"


def task_id_for(message: CallMessage) -> str:
    """The Celery task id of one attempt: the call_id, suffixed ``.<attempt>`` for retries."""
    return message.call_id if message.attempt == 0 else f"{message.call_id}.{message.attempt}"
