"""``toolfleet status`` (workers, queues, calls in flight) and ``toolfleet history BRANCH_ID``.

Both read the fleet ``TOOLFLEET_BROKER_URL`` names; when it is unset they read the embedded
default: a fleet running now (a ``toolfleet run`` or ``demo`` in progress) or, for history,
the data the embedded Redis saved when the last one stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from toolfleet.cli.broker_probe import check_reachable, mask_url
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.record import EventRecord
from toolfleet.schemas.settings import ENV_PREFIX, Settings

__all__ = [
    "fleet_settings",
    "fleet_status",
    "load_history",
    "mask_url",
    "orphaned_batches",
    "register",
    "running_by_worker",
]

EXIT_NOT_FOUND = 1

_STATUS_EPILOG = """\
Examples:
  toolfleet status
  toolfleet status --json
  TOOLFLEET_BROKER_URL=redis://redis:6379/0 toolfleet status --timeout 2

Without TOOLFLEET_BROKER_URL it inspects the embedded fleet of a `toolfleet run` or
`toolfleet demo` running now. Exit codes: 0 shown; 2 no fleet to inspect or a bad setting.
"""

_HISTORY_EPILOG = """\
Examples:
  toolfleet history 3f2c1a9e-5b7d-4c1e-9a55-0d6f3b2e8c41
  toolfleet history 3f2c1a9e-5b7d-4c1e-9a55-0d6f3b2e8c41 --json

`toolfleet run` and `toolfleet demo` print the branch id of their batch. Without
TOOLFLEET_BROKER_URL the history comes from the embedded default's saved data.
Exit codes: 0 shown; 1 no history stored under BRANCH_ID; 2 a bad setting.
"""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``toolfleet status`` and ``toolfleet history`` to the ``toolfleet`` parser."""
    status = subparsers.add_parser(
        "status",
        help="workers online, queue depths and calls in flight",
        description="Show the fleet's workers (and the calls each is running), the depth of "
        "the sync and async queues, and the calls in flight.",
        epilog=_STATUS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    status.add_argument(
        "--timeout",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how long to wait for workers to answer (default 1.0)",
    )
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(func=_status)

    history = subparsers.add_parser(
        "history",
        help="a branch's stored history: each call's request and response, in order",
        description="Show the ActionRequest/ActionResponse messages stored for BRANCH_ID, "
        "in the order they were written.",
        epilog=_HISTORY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    history.add_argument("branch_id", metavar="BRANCH_ID")
    history.add_argument(
        "--json", action="store_true", help="print {branch_id, messages, events} as JSON"
    )
    history.set_defaults(func=_history)


@contextlib.contextmanager
def _fleet_settings(*, start_saved: bool) -> Iterator[tuple[Settings, str]]:
    """Settings with a broker URL, and a description of where it came from."""
    from toolfleet.cli.embedded import EmbeddedRedis, live_fleets, run_dir

    settings = Settings.from_env()
    if settings.broker_url:
        yield settings, ENV_PREFIX + "BROKER_URL"
        return
    for pid, url in live_fleets(settings):
        yield settings.model_copy(update={"broker_url": url}), f"the embedded fleet of pid {pid}"
        return
    if not start_saved:
        raise ConfigurationError(
            f"no fleet to inspect: {ENV_PREFIX}BROKER_URL is unset and no embedded fleet is "
            f"running; set {ENV_PREFIX}BROKER_URL=redis://host:6379/0 (or run `toolfleet demo`)"
        )
    home = run_dir(settings)
    reader_dir = home / "run" / f"reader-{os.getpid()}"
    saved = EmbeddedRedis(run_dir=reader_dir, data_dir=home / "embedded", save_on_stop=False)
    url = saved.start()
    try:
        if not saved.persistent:
            raise ConfigurationError(
                f"the embedded default's saved data in {home / 'embedded'} is in use by "
                f"another toolfleet process; retry when it ends, or set {ENV_PREFIX}BROKER_URL"
            )
        yield settings.model_copy(update={"broker_url": url}), f"saved data in {home}"
    finally:
        saved.stop()
        shutil.rmtree(reader_dir, ignore_errors=True)


# Shared with `toolfleet recover`.
fleet_settings = _fleet_settings


# -- status ----------------------------------------------------------------------------------


def orphaned_batches(client: Any, keys: Any) -> list[dict[str, str]]:
    """Open batches whose dispatcher no longer beats: ``toolfleet recover`` them."""
    found: list[dict[str, str]] = []
    for raw_batch, raw_branch in sorted(client.hgetall(keys.open_batches()).items()):
        batch_id, branch_id = raw_batch.decode(), raw_branch.decode()
        raw = client.get(keys.batch(batch_id))
        if raw is None:
            continue
        dispatcher_id = str(json.loads(raw).get("dispatcher_id", ""))
        if not client.exists(keys.dispatcher(dispatcher_id)):
            found.append({"batch_id": batch_id, "branch_id": branch_id})
    return found


def running_by_worker(client: Any, keys: Any) -> Counter[str]:
    """Calls started and not finished, by the worker whose started marker holds them."""
    found: Counter[str] = Counter()
    batch: list[bytes] = []

    def count(names: list[bytes]) -> None:
        for raw in client.mget(names):
            if raw is None:
                continue  # finished between SCAN and MGET
            try:
                worker = str(json.loads(raw)["worker"])
            except (ValueError, KeyError, TypeError):
                worker = "?"
            found[worker] += 1

    for key in client.scan_iter(match=keys.started("*"), count=1000):
        batch.append(key)
        if len(batch) >= 500:
            count(batch)
            batch = []
    if batch:
        count(batch)
    return found


def fleet_status(settings: Settings, *, timeout_s: float) -> dict[str, Any]:
    """Workers online (with their running calls), queue depths and calls in flight."""
    import redis

    from toolfleet.dispatcher.send.kombu_internals import count_queued, count_reserved
    from toolfleet.schemas.keys import Keys
    from toolfleet.workers.app import create_app, redis_url_of

    app = create_app(settings)
    check_reachable(redis_url_of(app), settings.broker_url)
    try:
        active: dict[str, list[dict[str, Any]]] = (
            app.control.inspect(timeout=timeout_s).active() or {}
        )
        client = redis.Redis.from_url(redis_url_of(app))
        try:
            queues = {
                queue: count_queued(client, queue)
                for queue in (settings.sync_queue, settings.async_queue)
            }
            running = running_by_worker(client, Keys(settings.key_prefix))
            in_flight = sum(running.values())
            unacked = count_reserved(client)
            orphaned = orphaned_batches(client, Keys(settings.key_prefix))
        finally:
            client.close()
    finally:
        app.close()
    # One source for every count: a worker's running calls are the started
    # markers it holds, so the rows add up to the footer's total. Celery's active list (which
    # counts a batch message once, and a call the pool has accepted but not started) only
    # names the tasks.
    workers = [
        {
            "hostname": hostname,
            "active": running.get(hostname, 0),
            "tools": sorted({str(t.get("name", "?")) for t in active.get(hostname, [])}),
        }
        for hostname in sorted(set(active) | set(running))
    ]
    return {
        "workers": workers,
        "queues": queues,
        "in_flight": in_flight,
        "delivered_unacked": unacked,
        "orphaned_batches": orphaned,
    }


def _status(args: argparse.Namespace) -> int:
    with _fleet_settings(start_saved=False) as (settings, source):
        status = fleet_status(settings, timeout_s=args.timeout)
    status["broker"] = mask_url(str(settings.broker_url))
    status["source"] = source
    if args.json:
        print(json.dumps(status))
        return 0
    out = Console()
    out.print(f"broker {status['broker']} (from {source})")
    workers = Table(title=f"workers online: {len(status['workers'])}", header_style="bold")
    for column in ("worker", "running calls", "tasks"):
        workers.add_column(column)
    for worker in status["workers"]:
        workers.add_row(worker["hostname"], str(worker["active"]), ", ".join(worker["tools"]))
    out.print(workers)
    queues = Table(title="queues", header_style="bold")
    queues.add_column("queue")
    queues.add_column("waiting", justify="right")
    for queue, depth in status["queues"].items():
        queues.add_row(queue, str(depth))
    out.print(queues)
    out.print(
        f"calls in flight: {status['in_flight']} running, "
        f"{status['delivered_unacked']} delivered to workers and not yet acknowledged"
    )
    for batch in status["orphaned_batches"]:
        out.print(
            f"[yellow]batch {batch['batch_id']} of branch {batch['branch_id']}: its dispatcher "
            f"is gone; complete its history with `toolfleet recover {batch['branch_id']}`[/]"
        )
    return 0


# -- history ---------------------------------------------------------------------------------


def load_history(settings: Settings, branch_id: str) -> tuple[list[Any], list[EventRecord]]:
    """The messages and event records stored for ``branch_id``, in written order."""
    import redis.asyncio as aioredis

    from toolfleet.dispatcher.history.history import load_records
    from toolfleet.schemas.keys import Keys
    from toolfleet.workers.app import create_app, redis_url_of

    app = create_app(settings)
    url = redis_url_of(app)
    app.close()
    check_reachable(url, settings.broker_url)

    async def load() -> tuple[list[Any], list[EventRecord]]:
        client = aioredis.Redis.from_url(url)
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
    from toolfleet.cli.embedded import EmbeddedRedis, live_fleets, run_dir, saved_data_dirs

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
    if args.json:
        payload = {
            "branch_id": args.branch_id,
            "messages": [m.model_dump(mode="json") for m in messages],
            "events": [e.to_dict() for e in events],
        }
        print(json.dumps(payload, default=str))
        return 0
    out = Console()
    table = Table(
        title=f"branch {args.branch_id}: {len(messages)} messages, {len(events)} events",
        header_style="bold",
    )
    for column in ("#", "time", "message", "function", "arguments / output"):
        table.add_column(column, overflow="fold")
    for number, message in enumerate(messages, start=1):
        content = message.content
        if message.role == "action_request":
            detail = Text(json.dumps(content.arguments, default=str))
        elif content.error is not None:
            detail = Text(f"error: {content.error}", style="red")
        else:
            detail = Text(json.dumps(content.output, default=str))
        table.add_row(
            str(number),
            message.created_at.strftime("%H:%M:%S.%f")[:-3],
            message.role.removeprefix("action_"),
            content.function,
            detail,
        )
    out.print(table)
    return 0
