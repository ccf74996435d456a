"""``toolfleet run`` (a JSONL batch of tool calls) and ``toolfleet demo`` (the built-in tour).

Both run on the fleet ``TOOLFLEET_BROKER_URL`` names or, when it is unset, on the embedded
default (a private Redis and two local workers that live as long as the command).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from rich.console import Console

from toolfleet.cli.batch_file import BatchLine, parse_batch_bytes
from toolfleet.cli.call_record import CallRecord
from toolfleet.cli.progress import (
    BatchProgress,
    render_problems,
    render_results,
    render_summary,
)
from toolfleet.cli.result_stream import ResultStream
from toolfleet.cli.tool_modules import add_tools_option, load_tool_modules, tool_modules
from toolfleet.schemas.errors import ConfigurationError, ToolfleetError

__all__ = ["EXIT_INTERRUPTED", "read_batch", "register", "write_records"]

EXIT_INTERRUPTED = 130
# Above this many lines a person gets only the summary; the results go to --output or --json.
_RESULTS_TABLE_MAX_ROWS = 50

_RUN_EPILOG = """\
BATCH is a JSONL file, one call per line: {"function": "name", "arguments": {...}}.
A malformed line is reported with its line number and gets an error result; the batch goes on.

Examples:
  toolfleet run calls.jsonl --tools mytools
  toolfleet run calls.jsonl --tools mytools,othertools --output results.jsonl
  cat calls.jsonl | toolfleet run - --tools mytools --json > results.jsonl
  toolfleet run calls.jsonl --tools mytools --strategy sequential --max-in-flight 8
  TOOLFLEET_BROKER_URL=redis://redis:6379/0 toolfleet run calls.jsonl --tools mytools

Without TOOLFLEET_BROKER_URL, toolfleet starts a private Redis and two local workers (one sync
prefork, one asyncio pool) for the duration of the command.
Exit codes: 0 every call completed; 1 some call failed, was denied or was malformed;
2 usage or configuration error; 130 interrupted (Ctrl-C).
"""

_DEMO_EPILOG = """\
Examples:
  toolfleet demo
  toolfleet demo --async-calls 100

The demo always runs on the embedded default (a private Redis and two local workers it starts
and stops itself), whatever TOOLFLEET_BROKER_URL says, so it needs no setup at all.
"""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``toolfleet run`` and ``toolfleet demo`` to the ``toolfleet`` parser."""
    run = subparsers.add_parser(
        "run",
        help="run a JSONL batch of tool calls on the fleet, with progress and a summary",
        description="Run every call of BATCH on the fleet and write one result per line, "
        "in input order.",
        epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("batch", metavar="BATCH", help="JSONL file of calls, or - for stdin")
    add_tools_option(run)
    run.add_argument(
        "--strategy",
        choices=("concurrent", "sequential"),
        default="concurrent",
        help="concurrent (default): all calls in flight at once, within the window; "
        "sequential: one after another",
    )
    run.add_argument(
        "--max-in-flight",
        "--max-concurrent",  # the old name, still accepted
        dest="max_in_flight",
        type=_positive_int,
        metavar="N",
        default=None,
        help="calls in flight at once (default: TOOLFLEET_MAX_IN_FLIGHT, 256); "
        "--max-concurrent is its old name",
    )
    run.add_argument(
        "--output", metavar="FILE", default=None, help="write the results here as JSONL"
    )
    run.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSONL on stdout, with no progress bar or tables",
    )
    run.set_defaults(func=_run)

    demo = subparsers.add_parser(
        "demo",
        help="run a built-in batch on a private local fleet: the quickest look at toolfleet",
        description="Run a built-in batch on the embedded default: blocking sync tools in "
        "worker processes, many async tools on the asyncio pool, a failing tool and its "
        "truthful error, and a call denied by a governance gate.",
        epilog=_DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--async-calls",
        type=_positive_int,
        default=40,
        metavar="N",
        help="how many async fetch_page calls to run (default 40)",
    )
    demo.add_argument(
        "--sync-calls",
        type=_positive_int,
        default=4,
        metavar="N",
        help="how many blocking checksum_file calls to run (default 4)",
    )
    demo.set_defaults(func=_demo)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def read_batch(
    source: str,
    stdin: BinaryIO | None = None,
    *,
    max_line_bytes: int | None = None,
    notes: list[str] | None = None,
) -> list[BatchLine]:
    """The lines of ``source`` (a path, or ``-`` for stdin), read as bytes and parsed."""
    if max_line_bytes is None:
        from toolfleet.schemas.settings import Settings

        max_line_bytes = 2 * Settings.from_env().max_argument_bytes + 4096
    if source == "-":
        return parse_batch_bytes(
            stdin if stdin is not None else sys.stdin.buffer,
            max_line_bytes=max_line_bytes,
            notes=notes,
        )
    path = Path(source)
    try:
        with path.open("rb") as handle:
            return parse_batch_bytes(handle, max_line_bytes=max_line_bytes, notes=notes)
    except FileNotFoundError:
        raise ConfigurationError(
            f"BATCH file {source!r} does not exist; pass a JSONL file or - for stdin"
        ) from None
    except (IsADirectoryError, PermissionError) as exc:
        raise ConfigurationError(
            f"BATCH file {source!r} cannot be read ({exc.strerror}); pass a readable UTF-8 "
            "JSONL file"
        ) from None


def write_records(records: Sequence[CallRecord], handle: TextIO, *, branch_id: str) -> None:
    """One JSON object per line, in input order, each naming the batch's branch."""
    for record in records:
        line = {"branch_id": branch_id, **record.to_json()}
        handle.write(json.dumps(line, default=str) + "\n")


def _open_output(path: str) -> TextIO:
    """Check up front that --output can be written, so a typo does not cost the batch."""
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(
            f"--output {path!r} cannot be written ({exc.strerror}); pass a writable file path"
        ) from None


def _run(args: argparse.Namespace) -> int:
    from toolfleet.schemas.settings import Settings

    settings = Settings.from_env()
    tools = tool_modules(settings.tools, args.tools)
    notes: list[str] = []
    lines = read_batch(
        args.batch, max_line_bytes=2 * settings.max_argument_bytes + 4096, notes=notes
    )
    for note in notes:
        print(f"toolfleet run: note: {note}", file=sys.stderr)
    load_tool_modules(tools)
    output = _open_output(args.output) if args.output else None
    err = Console(stderr=True)
    out = Console()
    for line in lines:
        if line.error is not None:
            print(f"toolfleet run: malformed {line.error}", file=sys.stderr)
    if not args.json and not settings.broker_url:
        err.print(
            "[dim]TOOLFLEET_BROKER_URL is unset: starting the embedded default "
            "(a private Redis and two local workers)…[/dim]",
            soft_wrap=True,
        )
    branch_id = str(uuid.uuid4())
    sinks: list[TextIO] = [output] if output is not None else []
    if args.json:
        sinks.append(sys.stdout)
    # Results go out as calls finish, so an interrupted or killed run keeps what finished.
    stream = ResultStream(lines, sinks, branch_id)
    try:
        result = _execute(
            lines,
            tools=tools,
            strategy=args.strategy,
            max_in_flight=args.max_in_flight,
            console=err,
            show_progress=not args.json,
            branch_id=branch_id,
            on_record=stream.add,
        )
    except KeyboardInterrupt:
        return _interrupted(stream, external=bool(settings.broker_url), output=args.output)
    except ToolfleetError as exc:
        print(f"toolfleet run: {exc}", file=sys.stderr)
        return 2
    finally:
        if output is not None:
            output.close()
    branch_id, records, elapsed_s = result
    stream.finish(records)
    if not args.json:
        if len(records) <= _RESULTS_TABLE_MAX_ROWS:
            out.print(render_results(records))
        else:
            problems = render_problems(records)
            if problems is not None:
                out.print(problems)
        out.print(render_summary(records, elapsed_s))
        out.print(
            f"branch {branch_id}: see its history with `toolfleet history {branch_id}`",
            soft_wrap=True,
        )
        if args.output:
            out.print(f"results written to {args.output}")
    return 0 if all(record.outcome == "done" for record in records) else 1


def _interrupted(stream: ResultStream, *, external: bool, output: str | None) -> int:
    """Ctrl-C: every line gets its result (unfinished ones cancelled), then say what stopped."""
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C must not lose the lines
        records = stream.interrupt()
    finished = sum(1 for r in records if r.outcome not in ("cancelled", "malformed"))
    cancelled = sum(1 for r in records if r.outcome == "cancelled")
    stopped = (
        "the batch was stopped; your fleet's workers keep running"
        if external
        else "the batch and the embedded fleet were stopped"
    )
    print(
        f"toolfleet run: interrupted: {finished} call(s) finished, {cancelled} cancelled; "
        f"{stopped}",
        file=sys.stderr,
    )
    if output:
        print(f"toolfleet run: results written to {output}", file=sys.stderr)
    branch_id = stream.branch_id
    if stream.calls_recorded:
        print(
            f"branch {branch_id}: see its history with `toolfleet history {branch_id}`",
            file=sys.stderr,
        )
    else:
        print("toolfleet run: no call had started; nothing was recorded", file=sys.stderr)
    return EXIT_INTERRUPTED


def _execute(
    lines: Sequence[BatchLine],
    *,
    tools: Sequence[str],
    strategy: str,
    max_in_flight: int | None,
    console: Console,
    show_progress: bool,
    gates: Sequence[Any] = (),
    embedded_only: bool = False,
    branch_id: str | None = None,
    on_record: Any = None,
) -> tuple[str, list[CallRecord], float]:
    from toolfleet.cli.batch_runner import run_batch
    from toolfleet.embedded import EmbeddedFleet, resolve_fleet
    from toolfleet.schemas.settings import Settings

    if embedded_only:
        base = Settings.from_env().model_copy(update={"broker_url": None, "tools": ()})
        fleet_cm: Any = EmbeddedFleet(tools=tools, base=base)
    else:
        fleet_cm = resolve_fleet(tools)
    with fleet_cm as settings:
        if not embedded_only and Settings.from_env().broker_url:
            _check_external_broker(settings)
        # Created once the fleet is up, so calls/s and the ETA count only the calls.
        progress = BatchProgress(len(lines), console, enabled=show_progress)
        with progress:
            result = asyncio.run(
                run_batch(
                    lines,
                    settings=settings,
                    strategy=strategy,
                    max_in_flight=max_in_flight,
                    gates=gates,
                    on_progress=progress.advance_outcome,
                    branch_id=branch_id,
                    on_record=on_record,
                    # Workers send progress only while a bar shows it.
                    on_call_progress=progress.show_call if progress.live else None,
                    on_call_end=progress.end_call if progress.live else None,
                )
            )
            progress.finish(result.records)
    return result.branch_id, result.records, result.elapsed_s


def _check_external_broker(settings: Any) -> None:
    from toolfleet.cli.broker_probe import check_reachable
    from toolfleet.workers.app import create_app, redis_url_of

    app = create_app(settings)
    try:
        check_reachable(redis_url_of(app), settings.broker_url)
    finally:
        app.close()


def _demo(args: argparse.Namespace) -> int:
    from toolfleet.cli.demo import run_demo

    branch_id = str(uuid.uuid4())

    def execute(*positional: Any, **options: Any) -> tuple[str, list[CallRecord], float]:
        return _execute(*positional, branch_id=branch_id, **options)

    try:
        return run_demo(sync_calls=args.sync_calls, async_calls=args.async_calls, execute=execute)
    except KeyboardInterrupt:
        print(
            "toolfleet demo: interrupted; its private fleet was stopped. What had run is in "
            f"`toolfleet history {branch_id}`",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
