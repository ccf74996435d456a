"""Optional comparison: the ``lionagi`` package's own ``Branch.act`` on the same tools.

Skipped with a message when lionagi is not installed (``pip install lionagi``); it is never a
dependency of toolfleet. Like the in-process mode, everything runs on one event loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["run_batch", "unavailable"]


def unavailable() -> str | None:
    if importlib.util.find_spec("lionagi") is None:
        return "lionagi is not installed; pip install lionagi to add its Branch.act to the table"
    return None


def run_batch(func: Callable[..., Any], arguments: Sequence[dict[str, Any]]) -> float:
    """Wall seconds for one ``lionagi.Branch.act`` of every call (concurrent strategy)."""
    from lionagi import Branch  # type: ignore[import-not-found, unused-ignore]

    async def main() -> float:
        branch = Branch(tools=[func])
        requests = [{"function": func.__name__, "arguments": a} for a in arguments]
        start = time.perf_counter()
        results = await branch.act(requests)
        wall_s = time.perf_counter() - start
        if len(results) != len(requests):
            raise RuntimeError(f"lionagi returned {len(results)} results for {len(requests)} calls")
        return wall_s

    return asyncio.run(main())
