"""The ``toolfleet`` command line. Each subcommand lives in its own module and registers itself.

Exit codes: 0 success; 1 some calls failed (``run``); 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from schemas.errors import ConfigurationError

__all__ = ["EXIT_CALLS_FAILED", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

EXIT_OK = 0
EXIT_CALLS_FAILED = 1
EXIT_USAGE = 2

# Modules that each define ``register(subparsers)``; a subcommand's handler is stored as
# ``func`` on its parser and returns the exit code.
_COMMAND_MODULES = (
    "dispatcher.cli.run",
    "workers.worker_cli",
    "dispatcher.cli.flower",
    "dispatcher.cli.admin",
    "dispatcher.cli.recover",
    "dispatcher.cli.tools",
    "dispatcher.cli.mcp",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="toolfleet",
        description="Run the tool calls of AI-agent conversations on a fleet of Celery workers.",
        epilog="Examples:\n  toolfleet demo\n  toolfleet run calls.jsonl --tools mytools\n"
        "  toolfleet worker --kind sync --tools mytools\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"toolfleet {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        register: Callable[[argparse._SubParsersAction[Any]], None]
        register = importlib.import_module(module_name).register
        register(subparsers)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("toolfleet")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        code: int = func(args)
    except ConfigurationError as exc:
        print(f"toolfleet: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
