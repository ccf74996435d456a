"""Tools for the approval tests; workers load this module with --tools.

Each run appends ``<tool> <token> <pid>`` to its side channel, a plain file the test names
(``side``): the test counts what really ran, not what Redis says.
"""

from __future__ import annotations

import os

from toolfleet.workers.registry import tool

__all__ = ["free_lookup", "refund", "shell"]


def _ran(side: str, name: str, token: int) -> None:
    fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{name} {token} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


@tool(approval=True, secret_args=("card",))
def refund(side: str, token: int, amount: int, card: str = "") -> str:
    """Refund ``amount``; every call waits for someone's approval."""
    _ran(side, "refund", token)
    return f"refunded {amount}"


@tool
async def free_lookup(side: str, token: int) -> str:
    """A tool that needs no approval."""
    _ran(side, "free_lookup", token)
    return f"looked up {token}"


@tool
def shell(side: str, token: int, action: str) -> str:
    """A tool a PermissionPolicy escalates."""
    _ran(side, "shell", token)
    return f"ran {action}"
