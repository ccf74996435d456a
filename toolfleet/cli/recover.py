"""``toolfleet recover BRANCH_ID``: complete the batches a dead dispatcher left half-written.

Reads each open batch journal of the branch, waits (bounded, with a progress bar) for its calls
still queued or running, and writes every missing unit in input order (see
:mod:`toolfleet.dispatcher.history.recover`). Recovering twice writes nothing twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from toolfleet.schemas.settings import ENV_PREFIX

__all__ = ["register"]

EXIT_NOTHING = 1

_EPILOG = """\
Examples:
  toolfleet recover 3f2c1a9e-5b7d-4c1e-9a55-0d6f3b2e8c41
  toolfleet recover 3f2c1a9e-5b7d-4c1e-9a55-0d6f3b2e8c41 --wait-s 60 --json

`toolfleet status` lists the batches whose dispatcher is gone. A batch whose dispatcher still
beats (it may only be slow) is skipped unless --force. Exit codes: 0 recovered (or nothing
missing); 1 no open batch for BRANCH_ID; 2 a bad setting or no fleet.
"""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "recover",
        help="complete a dead dispatcher's batches: every call of them one linked pair",
        description="Write the missing history of BRANCH_ID's batches whose dispatcher died: "
        "finished calls with their real records, calls never enqueued as ABORTED.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "branch_id", metavar="BRANCH_ID", help="the branch whose open batch to complete"
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for calls still queued or running (default 300)",
    )
    parser.add_argument(
        "--force", action="store_true", help="also recover batches whose dispatcher still beats"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=_recover)


def _recover(args: argparse.Namespace) -> int:
    from toolfleet.cli.admin import fleet_settings

    with fleet_settings(start_saved=True) as (settings, source):
        report = asyncio.run(_run(settings, args))
    payload = {
        "branch_id": args.branch_id,
        "source": source,
        "batches": report.batches,
        "skipped_live": report.skipped_live,
        "written": report.written,
        "outcomes": report.outcomes,
    }
    if args.json:
        print(json.dumps(payload))
    else:
        out = Console(stderr=True)
        for batch_id in report.skipped_live:
            out.print(
                f"batch {batch_id}: its dispatcher is still alive; not recovered (--force to "
                "recover anyway)"
            )
        out.print(
            f"recovered {len(report.batches)} batch(es) of branch {args.branch_id}: "
            f"{report.written} call(s) written {report.outcomes}"
        )
    if not report.batches and not report.skipped_live:
        print(
            f"toolfleet recover: no open batch for branch {args.branch_id!r} (looked in "
            f"{source}); nothing is missing, or check the id and {ENV_PREFIX}BROKER_URL",
            file=sys.stderr,
        )
        return EXIT_NOTHING
    return 0


async def _run(settings: Any, args: argparse.Namespace) -> Any:
    from toolfleet.dispatcher.fleet import Fleet
    from toolfleet.dispatcher.history.recover import recover_branch

    fleet = Fleet(settings.model_copy(update={"tools": ()}))
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("waiting for calls in flight"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        console=console,
        disable=args.json or not console.is_terminal,
    )
    task = progress.add_task("calls", total=None)

    def advance(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    try:
        with progress:
            return await recover_branch(
                args.branch_id,
                fleet,
                wait_s=args.wait_s,
                include_live=args.force,
                on_progress=advance,
            )
    finally:
        await fleet.aclose()
