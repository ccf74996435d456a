"""What a LangGraph tool returns, across the wire and back.

A tool on a worker may return what a tool under ``ToolNode`` returns: a ``Command`` (a state
``update``, a ``goto``), a ``ToolMessage``, or a list of them. Its result reaches the caller as
JSON, in the form toolfleet's serializer gives those objects (``to_jsonable``):

- a ``Command`` is the object of its fields, exactly ``{"graph", "update", "resume", "goto"}``
  (``graph`` null or ``"__parent__"``, ``goto`` a node name or a list of them);
- a message is the object of its fields, with ``"type"`` (``"tool"``, ``"ai"``, ``"human"``,
  ``"system"``) and ``"content"`` among them (a ``ToolMessage`` also has ``"tool_call_id"``).

:func:`graph_output` rebuilds them: a result of exactly that shape becomes the object again
(messages inside a Command's update too), so ToolNode validates and applies it as it would a
local tool's. Any other result is the tool's plain output. A ``Send`` in ``goto`` has no JSON
form: such a Command comes back unserializable, and the call fails with ToolNode's error for
an unexpected output.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage, messages_from_dict
from langgraph.types import Command

__all__ = ["COMMAND_FIELDS", "graph_output"]

COMMAND_FIELDS = frozenset({"graph", "update", "resume", "goto"})
_MESSAGE_TYPES = frozenset({"tool", "ai", "human", "system"})
# What a message's own fields always include (BaseMessage's), beside its type and content.
_MESSAGE_FIELDS = frozenset({"content", "type", "additional_kwargs", "response_metadata"})


def graph_output(output: Any) -> Any:
    """``output`` with a Command, a ToolMessage or a list of them rebuilt from their JSON."""
    if _is_command(output):
        return _command(output)
    if _is_message(output) and output["type"] == "tool":
        return _message(output)
    if (
        isinstance(output, list)
        and output
        and all(_is_command(o) or (_is_message(o) and o["type"] == "tool") for o in output)
    ):
        return [graph_output(o) for o in output]
    return output


def _is_command(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == COMMAND_FIELDS


def _is_message(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.get("type") in _MESSAGE_TYPES
        and _MESSAGE_FIELDS <= set(value)
    )


def _message(value: dict[str, Any]) -> BaseMessage:
    [message] = messages_from_dict([{"type": value["type"], "data": value}])
    return message


def _messages_in(value: Any) -> Any:
    if isinstance(value, list) and value and all(_is_message(v) for v in value):
        return [_message(v) for v in value]
    return value


def _command(value: dict[str, Any]) -> Command[Any]:
    update = value["update"]
    if isinstance(update, dict):
        update = {key: _messages_in(item) for key, item in update.items()}
    else:
        update = _messages_in(update)
    goto = value["goto"]
    return Command(
        graph=value["graph"],
        update=update,
        resume=value["resume"],
        goto=tuple(goto) if isinstance(goto, list) else goto,
    )
