"""``toolfleet status`` (workers, queues, calls in flight) and ``toolfleet history BRANCH_ID``.

Both read the fleet ``TOOLFLEET_BROKER_URL`` names; when it is unset they read the embedded
default: a fleet running now (a ``toolfleet run`` or ``demo`` in progress) or, for history,
the data the embedded Redis saved when the last one stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.table import Table

from toolfleet.cli.broker_probe import check_reachable, queue_depths
from toolfleet.cli.broker_topology import persistence, persistence_warning, topology
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import ENV_PREFIX, Settings, masked_url

__all__ = [
    "fleet_settings",
    "fleet_status",
    "mask_url",
    "orphaned_batches",
    "register",
    "running_by_worker",
]


# The name this module has always exported the one masking under.
mask_url = masked_url

_STATUS_EPILOG = """\
Examples:
  toolfleet status
  toolfleet status --json
  TOOLFLEET_BROKER_URL=redis://redis:6379/0 toolfleet status --timeout 2

Without TOOLFLEET_BROKER_URL it inspects the embedded fleet of a `toolfleet run` or
`toolfleet demo` running now. Exit codes: 0 shown; 2 no fleet to inspect or a bad setting.
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


@contextlib.contextmanager
def _fleet_settings(*, start_saved: bool) -> Iterator[tuple[Settings, str]]:
    """Settings with a broker URL, and a description of where it came from."""
    from toolfleet.embedded import EmbeddedRedis, live_fleets, run_dir

    settings = Settings.from_env()
    if settings.broker_url:
        from toolfleet.workers.app_info import redis_url_from

        # One line naming the broker, not a traceback from deep inside, when it is down.
        url = redis_url_from(settings.broker_url, settings.sentinel_master)
        check_reachable(url, settings.broker_url)
        yield settings, ENV_PREFIX + "BROKER_URL"
        return
    for pid, url in live_fleets(settings):
        yield settings.model_copy(update={"broker_url": url}), f"the embedded fleet of pid {pid}"
        return
    if not start_saved:
        raise ConfigurationError(
            f"no fleet to inspect: {ENV_PREFIX}BROKER_URL is unset and no embedded fleet is "
            f"running; set {ENV_PREFIX}BROKER_URL=redis://host:6379/0, or run this while a "
            f"`toolfleet run`, `demo` or `mcp` runs (its embedded fleet stops when it ends)"
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


def _topology_table(broker: dict[str, Any]) -> Table:
    """The broker's role, persistence, and its replicas (or its primary) with their lag."""
    kept = broker["persistence"]
    table = Table(title=f"broker: {broker['role']}", header_style="bold")
    for column in ("node", "role", "state", "lag"):
        table.add_column(column)
    table.add_row("this broker", broker["role"], f"persistence {kept['mode']}", "")
    primary = broker.get("primary")
    if primary:
        table.add_row(primary["address"], "primary", f"link {primary['link']}",
                      f"{primary['last_io_s']}s since last I/O")  # fmt: skip
    for replica in broker["replicas"]:
        table.add_row(replica["address"], "replica", replica["state"],
                      f"{replica['lag_s']}s, {replica['lag_bytes']} bytes")  # fmt: skip
    return table


def _sentinel_table(views: list[dict[str, Any]]) -> Table:
    """Each sentinel's view of the primary (a Sentinel broker URL): the address it names, the
    quorum, how many sentinels and replicas it knows, its flags for the primary."""
    table = Table(title="sentinels", header_style="bold")
    for column in ("sentinel", "primary", "quorum", "sentinels", "replicas", "flags"):
        table.add_column(column)
    for view in views:
        if "error" in view:
            table.add_row(view["sentinel"], f"no answer: {view['error']}", "", "", "", "")
        elif "primary" not in view:
            known = ", ".join(view.get("known", [])) or "nothing"
            table.add_row(view["sentinel"], f"does not monitor it (monitors {known})",
                          "", "", "", "")  # fmt: skip
        else:
            table.add_row(view["sentinel"], view["primary"], str(view["quorum"]),
                          str(view["sentinels"]), str(view["replicas"]), view["flags"])  # fmt: skip
    return table


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


def awaiting_approval(client: Any, keys: Any) -> dict[str, Any]:
    """How many calls are parked for approval, and how long the oldest has waited."""
    count = int(client.zcard(keys.approvals()))
    oldest = client.zrange(keys.approvals(), 0, 0, withscores=True)
    age_s = round(max(0.0, time.time() - float(oldest[0][1])), 1) if oldest else None
    return {"count": count, "oldest_age_s": age_s}


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

    from toolfleet.broker.redis_url import sentinel_views, sync_client
    from toolfleet.dispatcher.infra.kombu_internals import count_reserved
    from toolfleet.schemas.keys import Keys
    from toolfleet.schemas.sentinel_url import is_sentinel
    from toolfleet.workers.app import create_app, redis_url_of

    app = create_app(settings)
    check_reachable(redis_url_of(app), settings.broker_url)
    try:
        active: dict[str, list[dict[str, Any]]] = (
            app.control.inspect(timeout=timeout_s).active() or {}
        )
        queues = queue_depths(app, [settings.queue_for("sync"), settings.queue_for("async")])
        client = sync_client(redis_url_of(app))
        try:
            running = running_by_worker(client, Keys(settings.key_prefix))
            in_flight = sum(running.values())
            unacked = count_reserved(client)
            orphaned = orphaned_batches(client, Keys(settings.key_prefix))
            approvals = awaiting_approval(client, Keys(settings.key_prefix))
            broker = {"persistence": persistence(client), **topology(client)}
            if is_sentinel(settings.broker_url):
                broker["sentinels"] = sentinel_views(redis_url_of(app))
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
        "awaiting_approval": approvals,
        # role, replicas and their lag, persistence mode (toolfleet.cli.broker_topology)
        "topology": broker,
    }


def _status(args: argparse.Namespace) -> int:
    with _fleet_settings(start_saved=False) as (settings, source):
        status = fleet_status(settings, timeout_s=args.timeout)
    status["broker"] = masked_url(str(settings.broker_url))
    status["source"] = source
    # An embedded fleet's Redis is toolfleet's own, saved when it stops: nothing to set.
    warning = None
    if source == ENV_PREFIX + "BROKER_URL":
        warning = persistence_warning(status["topology"]["persistence"], status["broker"])
    status["warnings"] = [warning] if warning else []
    if args.json:
        print(json.dumps(status))
        return 0
    out = Console()
    out.print(f"broker {status['broker']} (from {source})")
    out.print(_topology_table(status["topology"]))
    if "sentinels" in status["topology"]:
        out.print(_sentinel_table(status["topology"]["sentinels"]))
    for line in status["warnings"]:
        out.print(f"[yellow]{line}[/]", highlight=False, soft_wrap=True)  # one line
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
    waiting = status["awaiting_approval"]
    if waiting["count"]:
        out.print(
            f"calls awaiting approval: {waiting['count']} (the oldest for "
            f"{waiting['oldest_age_s']:g}s); `toolfleet approvals` lists them"
        )
    for batch in status["orphaned_batches"]:
        out.print(
            f"[yellow]batch {batch['batch_id']} of branch {batch['branch_id']}: its dispatcher "
            f"is gone; complete its history with `toolfleet recover {batch['branch_id']}`[/]"
        )
    return 0
