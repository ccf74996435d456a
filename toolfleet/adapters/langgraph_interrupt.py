"""``interrupt()`` in a tool of ``FleetToolNode`` (toolfleet.adapters.langgraph), across the
process boundary.

A tool on a worker that calls ``interrupt(value)`` with no resume value left for it stops
there; its call fails with ``ToolInterruptedError`` whose fields say which ``interrupt()`` of
the run it was (``index``) and what it asked (``value``) (toolfleet.workers.graph_context).
The stand-in then calls LangGraph's own ``interrupt(value)`` in the node, so the graph pauses
as under ``ToolNode``, with the same ``Interrupt`` in ``__interrupt__``. On
``Command(resume=...)`` LangGraph runs the node again: the call of the same tool-call id is
answered from toolfleet's record (C7), the local ``interrupt(value)`` now returns the resume
value, and the tool is sent again as a new call, ``<tool call id>#resume-<n>``, carrying every
resume value given so far: on the worker the tool runs again from the start, its
``interrupt()`` calls returning them in order — as LangGraph re-runs a node from its start.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from langgraph.types import interrupt

from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.errors import ConfigurationError, ToolInterruptedError

__all__ = ["Pause", "paused", "resumed", "resumed_async"]


class Pause(NamedTuple):
    """Where a tool on a worker stopped: its ``place``-th ``interrupt()`` (from 0), asking
    ``value``."""

    place: int
    value: Any


def paused(result: ActionResponseModel) -> Pause | None:
    """The pause ``result`` records, if its tool stopped at an ``interrupt()``."""
    info = result.error_info
    if info is None or info.type != ToolInterruptedError.__qualname__:
        return None
    return Pause(int(info.fields.get("index") or 0), info.fields.get("value"))


def _next_call(name: str, sent: dict[str, Any], pause: Pause, given: list[Any]) -> dict[str, Any]:
    """The call that runs the tool again with one more resume value: LangGraph's
    ``interrupt(value)`` here raises GraphInterrupt (the graph pauses) until it is resumed."""
    answer = interrupt(pause.value)
    try:
        json.dumps(answer)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"tool {name!r}: the resume value for its interrupt() is a "
            f"{type(answer).__name__}, not JSON, so it cannot reach a worker; resume with "
            "Command(resume=<JSON value>)"
        ) from None
    given.append(answer)
    # Beside the arguments, not in them: the dispatcher takes resume values from the envelope
    # only, so a model's arguments can never answer an interrupt().
    return {**sent, "id": f"{sent['id']}#resume-{len(given)}", "graph_resume": list(given)}


def resumed(
    name: str,
    sent: dict[str, Any],
    result: ActionResponseModel,
    send: Callable[[dict[str, Any]], ActionResponseModel],
) -> ActionResponseModel:
    """``result``, or while it records a pause, the result of the tool run again with the
    resume values (``send`` sends one call)."""
    given: list[Any] = []
    while (pause := paused(result)) is not None and "id" in sent:
        result = send(_next_call(name, sent, pause, given))
    return result


async def resumed_async(
    name: str,
    sent: dict[str, Any],
    result: ActionResponseModel,
    send: Callable[[dict[str, Any]], Awaitable[ActionResponseModel]],
) -> ActionResponseModel:
    """:func:`resumed` for the node's async path."""
    given: list[Any] = []
    while (pause := paused(result)) is not None and "id" in sent:
        result = await send(_next_call(name, sent, pause, given))
    return result
