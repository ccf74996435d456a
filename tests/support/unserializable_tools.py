"""Tools that return values with no JSON form (ADR-0012 D1: the output becomes the marker
``"<unserializable>"``); the workers load this module with --tools."""

from __future__ import annotations

from toolfleet.workers.registry import tool

__all__ = ["gives_bytes", "gives_object_async", "gives_the_marker_text"]


@tool
def gives_bytes(n: int) -> bytes:
    """Bytes: not JSON."""
    return bytes(n)


@tool
async def gives_object_async(n: int) -> object:
    """A plain object: not JSON."""
    return object()


@tool
def gives_the_marker_text() -> str:
    """The marker's text itself, which is a fine string."""
    return "<unserializable>"
