"""The bench tools registered for toolfleet workers and dispatchers (``--tools bench.fleet_tools``).

A separate module from :mod:`bench.tools` so the in-process and raw-Celery modes never import
toolfleet's registry.
"""

from __future__ import annotations

from bench import tools
from toolfleet.workers.registry import tool

__all__ = ["TOOL_MODULE"]

TOOL_MODULE = __name__

for _func in tools.TOOLS:
    tool(_func)
