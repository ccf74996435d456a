"""Tools for the LangGraph adapter's tests, loaded by their workers: parameters LangGraph
injects (``InjectedState``, ``InjectedToolCallId``, a subclass of ``InjectedToolArg``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from langchain_core.tools import InjectedToolArg, InjectedToolCallId, ToolException
from langgraph.prebuilt import InjectedState

from toolfleet.workers.registry import tool

__all__ = ["AuditTag", "OutOfStock", "buy", "file_note"]


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
