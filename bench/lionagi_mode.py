"""Optional comparison: the ``lionagi`` package's own ``Branch.act`` on the same tools.

Skipped with a message when lionagi is not installed (``pip install lionagi``); it is never a
dependency of toolfleet. Like the in-process mode, everything runs on one event loop.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import tempfile
import time
import typing
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
        with tempfile.TemporaryDirectory(prefix="bench-lionagi-") as log_dir:
            # Its logs would otherwise be dumped as files under ./data/logs at exit.
            log_config = {"persist_dir": log_dir, "auto_save_on_exit": False}
            branch = Branch(tools=[_resolved(func)], log_config=log_config)
            return await _timed(branch)

    async def _timed(branch: Any) -> float:
        requests = [{"function": func.__name__, "arguments": a} for a in arguments]
        start = time.perf_counter()
        results = await branch.act(requests)
        wall_s = time.perf_counter() - start
        if len(results) != len(requests):
            raise RuntimeError(f"lionagi returned {len(results)} results for {len(requests)} calls")
        return wall_s

    return asyncio.run(main())


def _resolved(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with real annotation objects: lionagi's schema builder cannot read the string
    annotations ``from __future__ import annotations`` leaves behind."""
    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await func(*args, **kwargs)

    else:

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)

    wrapper.__annotations__ = typing.get_type_hints(func)
    wrapper.__signature__ = inspect.signature(func, eval_str=True)  # type: ignore[attr-defined]
    return wrapper
