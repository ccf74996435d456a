"""``toolfleet approvals``, ``approve CALL_ID`` and ``deny CALL_ID --reason TEXT``: decide the
calls parked for approval, from any terminal that reaches the broker (docs/controls.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

from toolfleet.schemas.approval import ApprovalRequest
from toolfleet.schemas.errors import ApprovalNotWaitingError

__all__ = ["register"]

T = TypeVar("T")

EXIT_NOT_WAITING = 1

_EPILOG = """\
Examples:
  toolfleet approvals
  toolfleet approvals --json
  toolfleet approve 7d0c5e1a-...
  toolfleet deny 7d0c5e1a-... --reason "refunds over 100 EUR need a manager"

A call waits when its tool is declared @tool(approval=True), or a PermissionPolicy escalates
it with no on_escalate. The first decision stands; a denied call is not run and the model
reads the reason. Exit codes: 0 listed or decided; 1 the call is not waiting (unknown,
already decided, or timed out); 2 a bad setting or no fleet.
"""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    listing = subparsers.add_parser(
        "approvals",
        help="the calls waiting for approval: tool, arguments, branch, age",
        description="List every call of the fleet parked for approval, oldest first "
        "(secret argument values are never shown).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument(
        "--json", action="store_true", help="print one JSON object per waiting call"
    )
    listing.set_defaults(func=_list)
    verbs = (
        ("approve", "let the waiting call run"),
        ("deny", "refuse the waiting call; the model reads --reason"),
    )
    for name, verb in verbs:
        parser = subparsers.add_parser(
            name,
            help=f"{verb} (CALL_ID from `toolfleet approvals`)",
            description=f"{verb.capitalize()}: CALL_ID as `toolfleet approvals` lists it.",
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument("call_id", metavar="CALL_ID")
        parser.add_argument(
            "--reason",
            required=name == "deny",
            help="why (required to deny: the model reads it)",
        )
        parser.add_argument("--by", help="who decides (default: user@host)")
        parser.add_argument("--json", action="store_true", help="print the decided call")
        parser.set_defaults(func=_decide, decision=name)


def _with_fleet(work: Callable[[Any], Awaitable[T]]) -> T:
    from toolfleet.cli.admin import fleet_settings
    from toolfleet.dispatcher.fleet import Fleet

    with fleet_settings(start_saved=False) as (settings, _source):
        fleet = Fleet(settings.model_copy(update={"tools": ()}))

        async def run() -> T:
            try:
                return await work(fleet)
            finally:
                await fleet.aclose()

        try:
            return asyncio.run(run())
        finally:
            fleet.close()


def _list(args: argparse.Namespace) -> int:
    waiting: list[ApprovalRequest] = _with_fleet(lambda fleet: fleet.approvals())
    now_s = time.time()
    if args.json:
        for request in waiting:
            shown = request.model_dump(mode="json")
            shown["age_s"] = round(request.age_s(now_s), 3)
            print(json.dumps(shown))
        return 0
    console = Console()
    if not waiting:
        console.print("no call is waiting for approval")
        return 0
    table = Table("CALL ID", "TOOL", "ARGUMENTS", "BRANCH", "AGE", "WHY", box=None)
    for request in waiting:
        arguments = json.dumps(request.arguments, ensure_ascii=False)
        table.add_row(
            request.call_id,
            request.tool,
            arguments if len(arguments) <= 60 else arguments[:57] + "...",
            request.branch_id or "-",
            f"{request.age_s(now_s):.0f}s",
            request.reason,
        )
    console.print(table)
    return 0


def _decide(args: argparse.Namespace) -> int:
    async def decide(fleet: Any) -> ApprovalRequest:
        if args.decision == "approve":
            return await fleet.approve(args.call_id, by=args.by, reason=args.reason)
        return await fleet.deny(args.call_id, args.reason, by=args.by)

    try:
        decided = _with_fleet(decide)
    except ApprovalNotWaitingError as exc:
        print(f"toolfleet {args.decision}: {exc}", file=sys.stderr)
        return EXIT_NOT_WAITING
    except ValueError as exc:  # a blank --reason
        print(f"toolfleet {args.decision}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(decided.model_dump_json())
    else:
        print(f"call {decided.call_id} ({decided.tool}) {decided.state} by {decided.decided_by}")
    return 0
