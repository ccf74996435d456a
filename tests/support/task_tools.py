"""Tools for the MCP Tasks tests: one that reports progress and waits for a file, one that needs
approval, one that fails. A test releases ``slow_steps`` by creating the file it names."""

from __future__ import annotations

import asyncio
import os

from toolfleet.workers.current_call import current_call
from toolfleet.workers.registry import tool

__all__ = ["approved_refund", "approved_steps", "failing_tool", "slow_steps"]


@tool
async def slow_steps(gate: str, steps: int = 3) -> str:
    """Reports a progress step, then waits (at most a minute) for ``gate`` to exist."""
    return await _steps(gate, steps)


async def _steps(gate: str, steps: int) -> str:
    call = current_call()
    for step in range(steps):
        call.progress(step + 1, steps, f"step {step + 1} of {steps}")
    for _ in range(600):
        if await asyncio.to_thread(os.path.exists, gate):
            return f"done after {steps} steps"
        await asyncio.sleep(0.1)
    return "gave up waiting"


@tool(approval=True)
async def approved_steps(gate: str, steps: int = 3) -> str:
    """``slow_steps`` that waits for someone's approval first."""
    return await _steps(gate, steps)


@tool(approval=True)
def approved_refund(amount: int) -> str:
    """Every call waits for someone's approval."""
    return f"refunded {amount}"


@tool
def failing_tool(why: str) -> str:
    """Always raises: a tool error, so a completed task with isError."""
    raise ValueError(why)
