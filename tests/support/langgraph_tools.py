"""Tools for the LangGraph adapter's tests, loaded by their workers: parameters LangGraph
injects (``InjectedState``, ``InjectedToolCallId``, a subclass of ``InjectedToolArg``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import InjectedToolArg, InjectedToolCallId, ToolException
from langgraph.config import get_stream_writer
from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime
from langgraph.types import Command, Send, interrupt

from toolfleet.workers.registry import tool

__all__ = [
    "AuditTag",
    "OutOfStock",
    "ask_logged",
    "buy",
    "count_messages",
    "fan_out",
    "file_note",
    "mood_steps",
    "remember_in_store",
    "run_info",
    "set_mood",
    "stream_rows",
]


class AuditTag(InjectedToolArg):
    """A framework-injected marker of the application's own (a subclass counts too)."""


@tool
def file_note(
    text: str,
    path: str,
    auth: Annotated[str, InjectedState("auth")],
    note_id: Annotated[str, InjectedToolCallId],
    audit: Annotated[str | None, AuditTag()] = None,
) -> dict[str, Any]:
    """File a note; appends what the tool received, as one JSON line, to the file at ``path``.

    Args:
        text: The note.
        path: Where the note is filed.
    """
    received = {"text": text, "auth": auth, "note_id": note_id, "audit": audit}
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(json.dumps(received) + "\n")
    return {"filed": text, "by": auth[:5], "note": note_id}


class OutOfStock(Exception):
    """A shop's own error: its type is rebuilt on the caller's side, where it is importable."""


@tool
def buy(item: str) -> str:
    """Buy an item: "gold" is sold out (a ToolException), "lead" out of stock (OutOfStock)."""
    if item == "gold":
        raise ToolException("gold is sold out")
    if item == "lead":
        raise OutOfStock("lead is out of stock")
    return f"bought {item}"


@tool
def set_mood(mood: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
    """Set the conversation's mood, answer the call, and go to the node "after" as well."""
    answer = ToolMessage(f"mood is {mood}", tool_call_id=tool_call_id)
    return Command(update={"mood": mood, "messages": [answer]}, goto="after")


@tool
def mood_steps(tool_call_id: Annotated[str, InjectedToolCallId]) -> list[Any]:
    """Two outputs: a Command that sets the mood, and the ToolMessage that answers the call."""
    return [Command(update={"mood": "busy"}), ToolMessage("two steps", tool_call_id=tool_call_id)]


@tool
def count_messages(messages: Annotated[list[Any], InjectedState("messages")]) -> int:
    """How many messages the conversation has (LangGraph injects them: not JSON)."""
    return len(messages)


@tool
def remember_in_store(key: str, store: Annotated[Any, InjectedStore()]) -> str:
    """Remember a key in LangGraph's store (a live object: no worker can have it)."""
    return key


@tool
def run_info(runtime: ToolRuntime) -> str:
    """The tool call's id, from LangGraph's runtime (live objects: no worker can have it)."""
    return str(runtime.tool_call_id)


@tool
def stream_rows(rows: int, pause_s: float = 0.0) -> int:
    """Write each row to LangGraph's custom stream, ``pause_s`` apart."""
    writer = get_stream_writer()
    for row in range(rows):
        if row:
            time.sleep(pause_s)
        writer({"row": row})
    return rows


@tool
def ask_logged(path: str, questions: list[str]) -> list[Any]:
    """Ask each question through interrupt(), writing a line to the file at ``path`` before
    each (the side effect a re-run repeats) and one with each answer; returns the answers."""
    answers = []
    for question in questions:
        with Path(path).open("a", encoding="utf-8") as out:
            out.write(f"asking {question}\n")
        answer = interrupt({"question": question})
        with Path(path).open("a", encoding="utf-8") as out:
            out.write(f"answer {json.dumps(answer)}\n")
        answers.append(answer)
    return answers


@tool
def fan_out(nodes: list[str]) -> Command[Any]:
    """Send to each node (a Send has no JSON form)."""
    return Command(graph=Command.PARENT, goto=[Send(node, {}) for node in nodes])
