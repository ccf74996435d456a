"""``toolfleet worker``: start a sync (prefork) or async (asyncio pool) worker."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from celery import signals

from toolfleet.broker import tracing
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import ENV_PREFIX, Settings, masked_url

__all__ = ["ASYNC_POOL", "default_concurrency", "register", "run_worker"]

ASYNC_POOL = "toolfleet.workers.aio_pool:AsyncioPool"
# Coroutines in flight on one async worker: they mostly wait on I/O, so hundreds are cheap.
DEFAULT_ASYNC_CONCURRENCY = 500
# Processes per CPU on a sync worker: blocking tools mostly wait on I/O, not the CPU.
SYNC_PROCESSES_PER_CPU = 4
SYNC_MAX_DEFAULT = 64

_EPILOG_TEMPLATE = """\
defaults:
  --kind sync   prefork pool on the sync queue ({sq}); --concurrency defaults to
                {per} processes per CPU, at most {mx} (here {here}), because blocking
                tools mostly wait on I/O rather than use the CPU; prefetch {pf}.
  --kind async  toolfleet's asyncio pool on the async queue ({aq}):
                one event loop per worker; --concurrency is coroutines in flight
                (default {ac}).

environment:
  {env}BROKER_URL   required: the fleet's Redis, e.g. redis://10.0.0.5:6379/0
  {env}TOOLS        comma-separated tool modules (same as --tools)
  other {env}* settings as in schemas/settings.py (queues, visibility timeout, ...)

examples:
  export {env}BROKER_URL=redis://127.0.0.1:6379/0
  toolfleet worker --kind sync --tools mytools
  toolfleet worker --kind async --tools mytools,moretools --concurrency 1000
  toolfleet worker --kind sync --concurrency 8 --hostname sync-a@%h --loglevel DEBUG

Tool modules are imported from the current directory or PYTHONPATH. SIGTERM is a warm
shutdown: running calls finish (or are requeued) before the worker exits.
"""
_EPILOG = _EPILOG_TEMPLATE.format(
    sq=Settings().sync_queue,
    aq=Settings().async_queue,
    per=SYNC_PROCESSES_PER_CPU,
    mx=SYNC_MAX_DEFAULT,
    here=min(SYNC_MAX_DEFAULT, SYNC_PROCESSES_PER_CPU * (os.cpu_count() or 1)),
    pf=Settings().sync_prefetch,
    ac=DEFAULT_ASYNC_CONCURRENCY,
    env=ENV_PREFIX,
)


def default_concurrency(kind: str) -> int:
    if kind == "async":
        return DEFAULT_ASYNC_CONCURRENCY
    return min(SYNC_MAX_DEFAULT, SYNC_PROCESSES_PER_CPU * (os.cpu_count() or 1))


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``toolfleet worker`` to the ``toolfleet`` parser."""
    parser = subparsers.add_parser(
        "worker",
        help="start a worker that executes sync or async tool calls",
        description="Start a Celery worker that executes tool calls from the fleet's Redis.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kind",
        choices=("sync", "async"),
        required=True,
        help="sync: blocking tools in prefork processes; async: coroutines on an asyncio pool",
    )
    parser.add_argument(
        "--concurrency",
        "-c",
        type=int,
        default=None,
        help="processes (sync) or coroutines in flight (async); see defaults below",
    )
    parser.add_argument(
        "--tools",
        default=None,
        help=f"comma-separated tool modules to import (overrides {ENV_PREFIX}TOOLS)",
    )
    parser.add_argument("--loglevel", "-l", default="INFO", help="Celery log level (INFO)")
    parser.add_argument(
        "--hostname",
        "-n",
        default=None,
        help="worker node name (default: <kind>@<host>.<pid>; %%h = host name)",
    )
    parser.add_argument(
        "--task-events",
        "-E",
        action="store_true",
        help=f"send task events always, as {ENV_PREFIX}TASK_EVENTS=always (default: only "
        "while a monitor such as `toolfleet flower` watches)",
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    if args.tools is not None:
        overrides["tools"] = tuple(t.strip() for t in args.tools.split(",") if t.strip())
    if args.task_events:
        overrides["task_events"] = "always"
    settings = Settings.from_env(**overrides)
    if settings.broker_url is None:
        print(
            f"toolfleet worker: {ENV_PREFIX}BROKER_URL is not set; set it to the fleet's Redis "
            f"(e.g. export {ENV_PREFIX}BROKER_URL=redis://127.0.0.1:6379/0)",
            file=sys.stderr,
        )
        return 2
    if args.concurrency is not None and args.concurrency < 1:
        print(
            f"toolfleet worker: --concurrency must be at least 1, got {args.concurrency}",
            file=sys.stderr,
        )
        return 2
    return run_worker(
        settings,
        kind=args.kind,
        concurrency=args.concurrency or default_concurrency(args.kind),
        loglevel=args.loglevel,
        hostname=args.hostname or f"{args.kind}@%h.{os.getpid()}",
    )


def run_worker(
    settings: Settings, *, kind: str, concurrency: int, loglevel: str, hostname: str
) -> int:
    """Load the tools, build the app and run a Celery worker until it is told to stop."""
    from toolfleet.workers.app import create_app
    from toolfleet.workers.registry import registry

    # Before Celery starts, so a bad module is a one-line ConfigurationError (exit 2).
    # Like `celery -A`, tool modules import relative to where the worker was started.
    registry.load_modules(settings.tools, search_dir=os.getcwd())
    if tracing.configure_from_env(f"toolfleet-worker-{kind}"):
        # Spans are exported in batches: flush what is left when a process ends.
        signals.worker_process_shutdown.connect(_flush_spans, weak=False)
        signals.worker_shutdown.connect(_flush_spans, weak=False)
    app = create_app(settings, registry=registry)
    _wait_for_broker(app, str(settings.broker_url), settings.connect_limit_s)
    _warn_without_persistence(app, str(settings.broker_url))
    queue = settings.queue_for(kind)
    if kind == "async":
        app.conf.worker_pool = ASYNC_POOL
        app.conf.worker_prefetch_multiplier = settings.async_prefetch
    else:
        app.conf.worker_prefetch_multiplier = settings.sync_prefetch
    argv = [
        "worker",
        "--queues",
        queue,
        "--concurrency",
        str(concurrency),
        "--loglevel",
        loglevel,
        "--hostname",
        hostname,
    ]
    if settings.task_events == "always":
        argv.append("--task-events")  # else off until a monitor's lease (toolfleet.workers.monitor)
    if kind == "sync":
        argv += ["--pool", "prefork"]
    try:
        app.worker_main(argv=argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 0


# While a starting worker's broker does not answer, it asks again this often.
_PING_EVERY_S = 0.5


def _wait_for_broker(app: Any, broker_url: str, wait_s: float) -> None:
    """PING the broker until it answers; ConfigurationError (exit 2, one line) naming the
    masked URL if it does not within ``wait_s`` (TOOLFLEET_CONNECT_LIMIT_S: a worker started
    together with its Redis, by a compose stack or a boot script, waits that long for it; past
    that, a broker that does not answer is a wrong setting, not a slow start) or its host
    does not resolve. No ping starts that could not end within ``wait_s``."""
    import redis

    from toolfleet.broker.redis_url import check_sentinel_master, sync_client
    from toolfleet.workers.app import redis_url_of

    ping_s = min(2.0, wait_s)
    client = sync_client(redis_url_of(app), socket_connect_timeout=ping_s, socket_timeout=ping_s)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            started = time.monotonic()
            try:
                client.ping()
                return
            except redis.RedisError as exc:
                check_sentinel_master(redis_url_of(app))  # a wrong primary name
                unknown_host = "Name or service not known" in str(exc)
                took_s = time.monotonic() - started
                if unknown_host or time.monotonic() + _PING_EVERY_S + took_s > deadline:
                    raise ConfigurationError(
                        f"the broker {masked_url(broker_url)} does not answer within "
                        f"{ENV_PREFIX}CONNECT_LIMIT_S={wait_s:g}s ({exc}); check that it is "
                        f"running, or fix {ENV_PREFIX}BROKER_URL"
                    ) from None
                time.sleep(_PING_EVERY_S)
    finally:
        client.close()


def _warn_without_persistence(app: Any, broker_url: str) -> None:
    """One line on stderr when the broker would lose queued calls and records on a restart
    (or cannot say, a managed Redis refusing CONFIG); never a failure."""
    import redis

    from toolfleet.broker.redis_url import sync_client
    from toolfleet.cli.broker_topology import persistence, persistence_warning
    from toolfleet.workers.app import redis_url_of

    client = sync_client(redis_url_of(app), socket_connect_timeout=2.0, socket_timeout=2.0)
    try:
        warning = persistence_warning(persistence(client), masked_url(broker_url))
    except redis.RedisError:
        return  # the worker's own connection says what is wrong
    finally:
        client.close()
    if warning:
        print(warning, file=sys.stderr, flush=True)


def _flush_spans(**_: object) -> None:
    tracing.flush()
