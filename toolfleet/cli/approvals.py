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
from toolfleet.schemas.errors import ApprovalNotWaitingError, RequestError

__all__ = ["register"]

T = TypeVar("T")

EXIT_NOT_WAITING = 1
EXIT_AMBIGUOUS = 2
# As git does with commit ids: a prefix this short could name a call by accident.
MIN_PREFIX = 4

_EPILOG = """\
Examples:
  toolfleet approvals
  toolfleet approvals --json
  toolfleet approve 7d0c5e1a-3f4b-4c2e-9a1d-0b6e8f2a4c61
  toolfleet approve 7d0c5e                       (any unique prefix, as git takes)
  toolfleet deny 7d0c --reason "refunds over 100 EUR need a manager"

A call waits when its tool is declared @tool(approval=True), or a PermissionPolicy escalates
it with no on_escalate. The first decision stands; a denied call is not run and the model
reads the reason. Exit codes: 0 listed or decided; 1 the call is not waiting (unknown,
already decided, or timed out); 2 a prefix that names several waiting calls (they are
listed), a bad setting or no fleet.
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
            description=f"{verb.capitalize()}: CALL_ID as `toolfleet approvals` lists it, or "
            f"any prefix of it (at least {MIN_PREFIX} characters) that no other waiting call "
            "shares.",
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument(
            "call_id",
            metavar="CALL_ID",
            help=f"the call's id, or a prefix of it ({MIN_PREFIX}+ characters) no other "
            "waiting call shares",
        )
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
    # Ids are what a reader copies into `toolfleet approve`: never cut. The other columns
    # fold onto more lines when the terminal is narrow.
    widest = max(len(request.call_id) for request in waiting)
    table = Table(box=None)
    table.add_column("CALL ID", no_wrap=True, min_width=widest)
    for header in ("TOOL", "ARGUMENTS", "BRANCH", "AGE", "WHY"):
        table.add_column(header, overflow="fold")
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


class _Ambiguous(RequestError):
    """Raised when a CALL_ID prefix names several waiting calls."""


def _resolve(given: str, waiting: list[ApprovalRequest]) -> str:
    """The waiting call's full id that ``given`` is, or is the unique prefix of; ``given``
    itself when it names no waiting call (the decision then says it is not waiting)."""
    ids = [request.call_id for request in waiting]
    if given in ids or len(given) < MIN_PREFIX:
        return given
    matches = [call_id for call_id in ids if call_id.startswith(given)]
    if len(matches) > 1:
        raise _Ambiguous(
            f"{given!r} is the start of {len(matches)} waiting calls: {', '.join(matches)}; "
            "give more of the id"
        )
    return matches[0] if matches else given


def _decide(args: argparse.Namespace) -> int:
    async def decide(fleet: Any) -> ApprovalRequest:
        call_id = _resolve(args.call_id, await fleet.approvals())
        if args.decision == "approve":
            return await fleet.approve(call_id, by=args.by, reason=args.reason)
        return await fleet.deny(call_id, args.reason, by=args.by)

    try:
        decided = _with_fleet(decide)
    except ApprovalNotWaitingError as exc:
        print(f"toolfleet {args.decision}: {exc}", file=sys.stderr)
        return EXIT_NOT_WAITING
    except _Ambiguous as exc:
        print(f"toolfleet {args.decision}: {exc}", file=sys.stderr)
        return EXIT_AMBIGUOUS
    except ValueError as exc:  # a blank --reason
        print(f"toolfleet {args.decision}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(decided.model_dump_json())
    else:
        print(f"call {decided.call_id} ({decided.tool}) {decided.state} by {decided.decided_by}")
    return 0
