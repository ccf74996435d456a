"""The ``toolfleet`` command line. Each subcommand lives in its own module and registers itself.

Exit codes: 0 success; 1 some calls failed (``run``); 2 usage or configuration error;
141 the reader of stdout went away (``toolfleet history ID --json | head -c 100``), quietly,
as a Unix tool killed by SIGPIPE.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from toolfleet.schemas.errors import ConfigurationError

__all__ = [
    "EXIT_CALLS_FAILED",
    "EXIT_OK",
    "EXIT_READER_GONE",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

EXIT_OK = 0
EXIT_CALLS_FAILED = 1
EXIT_USAGE = 2
# What a shell reports for a command SIGPIPE ended (128 + 13): `yes | head -1` exits so too.
EXIT_READER_GONE = 141

# The module that defines each subcommand with ``register(subparsers)``; a subcommand's
# handler is stored as ``func`` on its parser and returns the exit code. Only the module of
# the command being run is imported, so ``toolfleet worker`` loads no dispatcher module.
_COMMANDS: dict[str, str] = {
    "run": "toolfleet.cli.run",
    "demo": "toolfleet.cli.run",
    "worker": "toolfleet.cli.worker",
    "flower": "toolfleet.cli.flower",
    "broker": "toolfleet.cli.broker",
    "status": "toolfleet.cli.admin",
    "history": "toolfleet.cli.history",
    "recover": "toolfleet.cli.recover",
    "tools": "toolfleet.cli.tools",
    "mcp": "toolfleet.cli.mcp",
    "approvals": "toolfleet.cli.approvals",
    "approve": "toolfleet.cli.approvals",
    "deny": "toolfleet.cli.approvals",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for ``command`` alone when it is a known command, else for every command."""
    parser = _Parser(
        prog="toolfleet",
        description="Run the tool calls of AI-agent conversations on a fleet of Celery workers.",
        epilog="Examples:\n  toolfleet demo\n  toolfleet run calls.jsonl --tools mytools\n"
        "  toolfleet worker --kind sync --tools mytools\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"toolfleet {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = (
        [_COMMANDS[command]] if command in _COMMANDS else list(dict.fromkeys(_COMMANDS.values()))
    )
    for module_name in modules:
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
    """Run one command; its exit code. A reader of stdout that goes away (``| head``) ends
    the command quietly with ``EXIT_READER_GONE``, whichever command was writing."""
    stdout_was = _identity(sys.stdout)
    try:
        code = _run(argv)
        sys.stdout.flush()  # what is still buffered, while the error can still be caught
    except OSError as exc:
        if not _reader_gone(exc):
            raise
        _discard_stdout()
        return EXIT_READER_GONE
    except SystemExit:
        # rich meets the same broken pipe in a table: it points stdout at /dev/null and
        # exits 1 (Console.on_broken_pipe). Say it as every other command does.
        if stdout_was not in (None, _identity_of(os.devnull)) and _identity(sys.stdout) == (
            _identity_of(os.devnull)
        ):
            return EXIT_READER_GONE
        raise
    return code


def _identity(stream: Any) -> tuple[int, int] | None:
    """The device and inode behind ``stream``'s descriptor; None when it has none."""
    try:
        found = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return found.st_dev, found.st_ino


def _identity_of(path: str) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _reader_gone(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a write to a pipe nobody reads any more."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, BrokenPipeError) or (
            isinstance(seen, OSError) and seen.errno == errno.EPIPE
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _discard_stdout() -> None:
    # The interpreter flushes stdout once more at exit; with the pipe gone that would print
    # "Exception ignored ... BrokenPipeError". Point the descriptor at /dev/null instead.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _run(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The top-level parser has no option that takes a value, so the first word that is not an
    # option names the command.
    command = next((word for word in argv if not word.startswith("-")), None)
    parser = build_parser(command)
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
    except Exception as exc:
        # A broker that stops answering mid-command is one line too, never a traceback.
        broker_down = _broker_down(exc)
        if broker_down is None:
            raise
        print(f"toolfleet {args.command}: {broker_down}", file=sys.stderr)
        return EXIT_USAGE
    return code


def _broker_down(exc: Exception) -> str | None:
    """What to say when ``exc`` means the broker stopped answering; None for anything else."""
    import redis

    from toolfleet.schemas.errors import BrokerError
    from toolfleet.schemas.settings import ENV_PREFIX, masked_url

    if isinstance(exc, BrokerError):
        return f"{exc}; check that the broker is running, then run the command again"
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return (
            f"the broker stopped answering ({masked_url(str(exc))}); check that it is "
            f"running and {ENV_PREFIX}BROKER_URL, then run the command again"
        )
    return None


if __name__ == "__main__":
    sys.exit(main())
