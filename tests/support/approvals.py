"""What the approval tests share: calls of the ``refund`` tool (tests/support/approval_tools.py),
the runs its side channel counts, and a wait until calls are parked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.waiting import until_async
from toolfleet import ApprovalRequest, Fleet

__all__ = ["parked", "ran", "refund"]


def ran(side: Path) -> list[tuple[str, int]]:
    """Each run the tools wrote to ``side``, as ``(tool, token)``, in the order they ran."""
    if not side.exists():
        return []
    return [(line.split()[0], int(line.split()[1])) for line in side.read_text().splitlines()]


def refund(side: Path, token: int, amount: int = 5, **extra: Any) -> dict[str, Any]:
    """A call of ``refund`` (which always waits for approval) that writes its run to ``side``."""
    arguments = {"side": str(side), "token": token, "amount": amount, **extra}
    return {"function": "refund", "arguments": arguments}


async def parked(
    fleet: Fleet, count: int = 1, where: Callable[[ApprovalRequest], bool] | None = None
) -> list[ApprovalRequest]:
    """The fleet's waiting calls, once exactly ``count`` are parked and each passes ``where``
    (oldest first).

    A call is parked, and listed, before this process's handlers are asked, so a test whose
    handlers decide some calls waits with ``where`` for the ones they leave."""

    async def found() -> list[ApprovalRequest] | None:
        waiting = await fleet.approvals()
        settled = len(waiting) == count and all(where is None or where(r) for r in waiting)
        return waiting if settled else None

    return await until_async(found, timeout_s=20, what=f"{count} call(s) parked")
