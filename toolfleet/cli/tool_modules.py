"""The tool modules a command loads: TOOLFLEET_TOOLS plus its ``--tools`` options.

``toolfleet run``, ``mcp`` and ``tools`` take the same option and load the same way, so a
module name means the same thing to each of them.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from toolfleet.schemas.errors import ConfigurationError

__all__ = ["add_tools_option", "load_tool_modules", "tool_modules"]


def add_tools_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--tools MODULE`` (comma-separated or repeated) to ``parser``."""
    parser.add_argument(
        "--tools",
        action="append",
        metavar="MODULE",
        default=[],
        help="module(s) defining the tools (comma-separated or repeated; added to TOOLFLEET_TOOLS)",
    )


def tool_modules(configured: Sequence[str], options: Sequence[str]) -> tuple[str, ...]:
    """``configured`` (TOOLFLEET_TOOLS), then each ``--tools`` module not already named."""
    named = (m.strip() for value in (*configured, *options) for m in value.split(","))
    modules = tuple(dict.fromkeys(m for m in named if m))
    if not modules:
        raise ConfigurationError(
            "no tool modules: pass --tools MODULE or set TOOLFLEET_TOOLS=module[,module]"
        )
    return modules


def load_tool_modules(modules: Sequence[str]) -> None:
    """Import ``modules`` into the registry, as the workers will: a wrong module name is a
    one-line error here, before any process starts, not a worker crash seconds later."""
    # `toolfleet run --tools mytools` next to mytools.py must import it here as the workers
    # do; a console script's sys.path lacks the working directory.
    from toolfleet.workers.registry import registry

    registry.load_modules(modules, search_dir=os.getcwd())
