"""``toolfleet history``: a branch's stored history, each call's request and response."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from toolfleet.cli.broker_probe import check_reachable
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.settings import ENV_PREFIX, Settings

__all__ = ["load_history", "register"]

EXIT_NOT_FOUND = 1

_HISTORY_EPILOG = """\
Examples:
  toolfleet history 3f2c1a9e-5b7d-4c1e-9a55-0d6f3b2e8c41
  toolfleet history 3f2c1a9e-5b7d-4c1e-9a55-0d6f3b2e8c41 --json
  toolfleet history 3f2c1a9e-5b7d-4c1e-9a55-0d6f3b2e8c41 --tail 20

`toolfleet run` and `toolfleet demo` print the branch id of their batch. Without
TOOLFLEET_BROKER_URL the history comes from the embedded default's saved data.
Exit codes: 0 shown; 1 no history stored under BRANCH_ID; 2 a bad setting.
"""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    history = subparsers.add_parser(
        "history",
        help="a branch's stored history: each call's request and response, in order",
        description="Show the ActionRequest/ActionResponse messages stored for BRANCH_ID, "
        "in the order they were written.",
        epilog=_HISTORY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    history.add_argument(
        "branch_id", metavar="BRANCH_ID", help="the branch id `toolfleet run` printed"
    )
    history.add_argument(
        "--json", action="store_true", help="print {branch_id, messages, events} as JSON"
    )
    shown = history.add_mutually_exclusive_group()
    shown.add_argument(
        "--limit", type=_calls_count, metavar="N", help="only the first N calls of the branch"
    )
    shown.add_argument(
        "--tail", type=_calls_count, metavar="N", help="only the last N calls of the branch"
    )
    history.set_defaults(func=_history)


def _calls_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of calls (1 or more)")
    return count


def load_history(settings: Settings, branch_id: str) -> tuple[list[Any], list[EventRecord]]:
    """The messages and event records stored for ``branch_id``, in written order."""

    from toolfleet.broker.redis_url import async_client
    from toolfleet.dispatcher.history.history import load_records
    from toolfleet.schemas.keys import Keys
    from toolfleet.workers.app import create_app, redis_url_of

    app = create_app(settings)
    url = redis_url_of(app)
    app.close()
    check_reachable(url, settings.broker_url)

    async def load() -> tuple[list[Any], list[EventRecord]]:
        client = async_client(url)
        try:
            messages, events = await load_records(client, Keys(settings.key_prefix), branch_id)
        finally:
            await client.aclose()
        return list(messages), events

    return asyncio.run(load())


def _find_history(branch_id: str) -> tuple[list[Any], list[EventRecord], list[str]]:
    """The branch's messages and events from the first store that has them, and every store
    looked in: TOOLFLEET_BROKER_URL, else each embedded fleet running now and each one's
    saved data (embedded runs at the same time keep theirs apart)."""
    from toolfleet.embedded import EmbeddedRedis, live_fleets, run_dir, saved_data_dirs

    settings = Settings.from_env()
    if settings.broker_url:
        messages, events = load_history(settings, branch_id)
        return messages, events, [ENV_PREFIX + "BROKER_URL"]
    looked: list[str] = []
    for pid, url in live_fleets(settings):
        looked.append(f"the embedded fleet of pid {pid}")
        messages, events = load_history(settings.model_copy(update={"broker_url": url}), branch_id)
        if messages or events:
            return messages, events, looked
    reader_dir = run_dir(settings) / "run" / f"reader-{os.getpid()}"
    for data_dir in saved_data_dirs(settings):
        saved = EmbeddedRedis(
            run_dir=reader_dir, data_dir=data_dir, save_on_stop=False, spill_over=False
        )
        try:
            url = saved.start()
            if not saved.persistent:
                continue  # held by a fleet running now, which was read above
            looked.append(f"saved data in {data_dir}")
            found = settings.model_copy(update={"broker_url": url})
            messages, events = load_history(found, branch_id)
        finally:
            saved.stop()
            shutil.rmtree(reader_dir, ignore_errors=True)
        if messages or events:
            return messages, events, looked
    return [], [], looked or [f"saved data in {run_dir(settings) / 'embedded'} (none yet)"]


def _history(args: argparse.Namespace) -> int:
    messages, events, looked = _find_history(args.branch_id)
    if not messages and not events:
        print(
            f"toolfleet history: no history stored for branch {args.branch_id!r} (looked in "
            f"{', '.join(looked)}); check the id printed by `toolfleet run`, and "
            f"{ENV_PREFIX}BROKER_URL",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND
    total = len(messages)
    messages, first = _calls_shown(messages, limit=args.limit, tail=args.tail)
    kept = {m.content.call_id for m in messages}
    events = [e for e in events if e.call_id in kept] if total != len(messages) else events
    if args.json:
        payload = {
            "branch_id": args.branch_id,
            "messages": [m.model_dump(mode="json") for m in messages],
            "events": [e.to_dict() for e in events],
        }
        print(json.dumps(payload, default=str))
        return 0
    out = Console()
    shown = "" if total == len(messages) else f" (of {total})"
    table = Table(
        title=f"branch {args.branch_id}: {len(messages)} messages{shown}, {len(events)} events",
        header_style="bold",
    )
    for column in ("#", "time", "message", "function", "arguments / output"):
        table.add_column(column, overflow="fold")
    for number, message in enumerate(messages, start=first):
        content = message.content
        if message.role == "action_request":
            detail = Text(_cell(json.dumps(content.arguments, default=str)))
        elif content.error is not None:
            detail = Text(_cell(f"error: {content.error}"), style="red")
        else:
            detail = Text(_cell(json.dumps(content.output, default=str)))
        table.add_row(
            str(number),
            message.created_at.strftime("%H:%M:%S.%f")[:-3],
            message.role.removeprefix("action_"),
            content.function,
            detail,
        )
    out.print(table)
    return 0


# A table cell shows at most this much of an argument list or output (--json shows all).
_CELL_CHARS = 2000


def _cell(text: str) -> str:
    if len(text) <= _CELL_CHARS:
        return text
    return f"{text[:_CELL_CHARS]}... ({len(text):,} characters; --json shows all)"


def _calls_shown(
    messages: list[Any], *, limit: int | None, tail: int | None
) -> tuple[list[Any], int]:
    """The messages of the first ``limit`` or last ``tail`` calls (a call is its request and
    its response), and the 1-based number of the first message shown."""
    starts = [i for i, m in enumerate(messages) if m.role == "action_request"]
    if limit is not None and limit < len(starts):
        return messages[: starts[limit]], 1
    if tail is not None and tail < len(starts):
        begin = starts[-tail]
        return messages[begin:], begin + 1
    return messages, 1
