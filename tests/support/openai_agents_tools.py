"""Tools for the OpenAI Agents SDK adapter's parity tests; workers load this module with
``--tools``, and the tests import it to run the same functions in the SDK's own executor.

``remember`` writes what it received, as JSON, to its side channel (a file the test names),
so a test reads what really reached the worker, not what toolfleet says it sent.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from agents import RunContextWrapper
from agents.tool_context import ToolContext
from pydantic import BaseModel

from toolfleet.adapters.openai_agents import fleet_tool
from toolfleet.workers.registry import tool

__all__ = [
    "Account",
    "Bar",
    "Profile",
    "account_line",
    "make_error",
    "make_model",
    "make_pair",
    "profile_line",
    "raise_value",
    "remember",
    "shout",
]


class Bar(BaseModel):
    bar: str


class Profile(BaseModel):
    name: str
    tier: int


@dataclasses.dataclass
class Account:
    owner: str
    balance: float


@tool
def raise_value(message: str) -> str:
    """Fail with a ValueError of ``message``."""
    raise ValueError(message)


@tool
def make_model(bar: str) -> Bar:
    """Return a pydantic model."""
    return Bar(bar=bar)


@tool
def make_error(message: str) -> ValueError:
    """Return (not raise) an exception."""
    return ValueError(message)


@tool
def make_pair(first: int, second: int) -> tuple[int, int]:
    """Return a tuple (JSON makes it a list on the way)."""
    return (first, second)


@tool
def shout(text: str) -> str:
    """Upper-case ``text``."""
    return text.upper()


@fleet_tool
def remember(ctx: ToolContext[Any], side: str, name: str) -> str:
    """Write what the tool received to ``side``; greet ``name``."""
    received = {
        "pid": os.getpid(),
        "name": name,
        "context": ctx.context,
        "tool_name": ctx.tool_name,
        "tool_call_id": ctx.tool_call_id,
        "tool_arguments": ctx.tool_arguments,
    }
    with open(side, "a", encoding="utf-8") as out:
        out.write(json.dumps(received) + "\n")
    return f"hello {name}"


@fleet_tool
def profile_line(ctx: RunContextWrapper[Profile], greeting: str) -> str:
    """Greet the run's user, read from a pydantic context."""
    profile = ctx.context
    return f"{greeting} {profile.name} tier {profile.tier} ({type(profile).__name__})"


@fleet_tool
async def account_line(ctx: RunContextWrapper[Account], label: str) -> str:
    """Describe the run's account, read from a dataclass context."""
    account = ctx.context
    return f"{label}: {account.owner} has {account.balance} ({type(account).__name__})"
