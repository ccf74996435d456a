"""Tools for the MCP server tests: ``@tool`` effect flags, declared outputs of each shape, and a
print at import (a tool module's stray stdout must not reach a stdio client)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from toolfleet.workers.registry import tool

__all__ = [
    "count_words",
    "delete_note",
    "forecast",
    "misdeclared",
    "plain_dict",
    "read_note",
]

print("tests.support.mcp_tools imported")  # on stdout, on purpose


class Forecast(BaseModel):
    city: str
    celsius: float


@tool(read_only=True, open_world=True)
def forecast(city: str) -> Forecast:
    """A read-only tool that reaches the outside world; returns a model."""
    return Forecast(city=city, celsius=21.5)


@tool(read_only=True, open_world=False)
def read_note(name: str) -> dict[str, str]:
    """Read-only, closed world; returns a dict."""
    return {"name": name, "text": f"the note {name}"}


@tool(destructive=True, idempotent=True)
def delete_note(name: str) -> dict[str, bool]:
    """Destructive, but deleting twice is deleting once."""
    return {"deleted": True}


@tool(destructive=False)
def count_words(text: str) -> int:
    """Not an object: no outputSchema, no structuredContent."""
    return len(text.split())


@tool
def plain_dict(key: str):  # type: ignore[no-untyped-def]
    """No return annotation, a dict output: structuredContent without an outputSchema."""
    return {key: 1}


@tool
def misdeclared() -> dict[str, int]:
    """Returns what its annotation does not promise."""
    result: Any = {"n": "many"}
    return result
