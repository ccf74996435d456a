"""Tools for the Pydantic AI adapter's tests, registered with its ``fleet_tool``; the workers of
``tests/integration/test_pydantic_ai_*.py`` load this module beside the agent tools.

Each tool that takes ``RunContext`` writes what it received — every argument the worker passed
it, and the context's fields — as one JSON line to the file its deps name (``Account.log``), so
a test reads what really reached the worker.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.exceptions import ApprovalRequired

from toolfleet.adapters.pydantic_ai_tools import fleet_tool

__all__ = [
    "Account",
    "Forecast",
    "account_report",
    "approved_transfer",
    "bare_context",
    "forecast",
    "guarded_delete",
    "impostor_retry",
    "retry_once",
    "slow_lookup",
]


@dataclass
class Account:
    """The deps of the test agents: JSON values only."""

    owner: str
    log: str


def _record(ctx: RunContext[Any], **arguments: Any) -> None:
    seen = {
        "arguments": {k: repr(v) for k, v in arguments.items()},
        "context": type(ctx).__name__,
        "deps": repr(ctx.deps),
        "deps_type": type(ctx.deps).__name__,
        "tool_name": ctx.tool_name,
        "tool_call_id": ctx.tool_call_id,
        "retry": ctx.retry,
        "max_retries": ctx.max_retries,
        "run_step": ctx.run_step,
        "run_id": ctx.run_id,
        "conversation_id": ctx.conversation_id,
        "approved": ctx.tool_call_approved,
        "pid": os.getpid(),
    }
    log = ctx.deps.log if isinstance(ctx.deps, Account) else ctx.deps["log"]
    with open(log, "a", encoding="utf-8") as out:
        out.write(json.dumps(seen) + "\n")


@fleet_tool
def account_report(ctx: RunContext[Account], section: str) -> str:
    """The report of one section of the account of the run's user.

    Args:
        section: Which section ("balance", "history").
    """
    _record(ctx, section=section)
    return f"{section} of {ctx.deps.owner}"


@fleet_tool
async def bare_context(ctx: RunContext, note: str = "") -> str:  # type: ignore[type-arg]
    """A tool whose RunContext names no deps type: the deps arrive as their JSON value."""
    _record(ctx, note=note)
    return f"{type(ctx.deps).__name__} {ctx.deps['owner']}"


@fleet_tool
def retry_once(ctx: RunContext[Account], amount: int) -> str:
    """Asks the model again on its first try; the retry count reaches the worker."""
    _record(ctx, amount=amount)
    if ctx.retry == 0:
        raise ModelRetry("say the amount in cents")
    return f"{amount} cents for {ctx.deps.owner}"


@fleet_tool(approval=True)
def approved_transfer(ctx: RunContext[Account], amount: int) -> str:
    """Moves money: every call waits for an approval."""
    _record(ctx, amount=amount)
    return f"moved {amount} for {ctx.deps.owner}"


@fleet_tool
def guarded_delete(ctx: RunContext[Account], path: str) -> str:
    """Deletes nothing, but only once the call is approved: asks for approval itself."""
    _record(ctx, path=path)
    if not ctx.tool_call_approved:
        raise ApprovalRequired()
    return f"deleted {path}"


class Forecast(BaseModel):
    city: str
    sky: str


@fleet_tool
def forecast(city: str) -> Forecast:
    """Returns a pydantic model, which a local tool's result keeps as the model."""
    return Forecast(city=city, sky="clear")


@fleet_tool(timeout_s=0.3)
async def slow_lookup(key: str) -> str:
    """Outruns its timeout."""
    await asyncio.sleep(10)
    return key


class Impostors:
    class ModelRetry(Exception):
        """Named like Pydantic AI's, but not it: a retry is recognised by type, not name."""


@fleet_tool
def impostor_retry(message: str) -> str:
    """Raises an exception class that is only named ModelRetry."""
    raise Impostors.ModelRetry(message)
