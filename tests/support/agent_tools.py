"""Tools for the agent-framework adapters' tests (LangGraph, Pydantic AI), loaded by their
workers beside ``tests.support.sample_tools``."""

from __future__ import annotations

import os

from pydantic_ai import ModelRetry
from pydantic_ai.exceptions import ToolFailed

from toolfleet.workers.registry import tool

__all__ = ["city_weather", "closed_shop"]


@tool
def city_weather(city: str) -> dict[str, object]:
    """The weather of a city, from a service that wants proper names.

    Args:
        city: The city's name, capitalized ("Paris").
    """
    if city != city.title():
        raise ModelRetry(f"write the city as a proper name, {city.title()!r}, not {city!r}")
    return {"city": city, "sky": "clear", "pid": os.getpid()}


@tool
def closed_shop(item: str) -> str:
    """Buy an item from a shop that is closed for good."""
    raise ToolFailed(f"the shop is closed; {item} cannot be bought today")
