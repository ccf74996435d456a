"""``toolfleet flower``: Flower, the Celery monitor, watching this fleet's broker.

Flower runs in this process against the same Celery app configuration the workers use, so it
decodes their events (JSON only) and reads the same queues. It binds 127.0.0.1 unless told
otherwise and keeps its task history in a state file in the run directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from toolfleet.cli.broker_probe import check_reachable
from toolfleet.cli.flower_internals import FlowerServer, ToolTask, ask_every_sentinel, track_calls
from toolfleet.embedded import live_fleets, run_dir
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import ENV_PREFIX, Settings, masked_url

__all__ = [
    "STATE_FILE_NAME",
    "ToolTask",
    "flower_argv",
    "register",
    "resolve_broker_url",
    "state_file",
    "track_calls",
]

STATE_FILE_NAME = "flower-state.db"
# Flower saves its state on shutdown; a periodic save bounds what a crash (SIGKILL) loses.
_STATE_SAVE_INTERVAL_MS = 60_000
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}

_EPILOG = """\
Examples:
  toolfleet flower                                   # http://127.0.0.1:5555
  toolfleet flower --basic-auth admin:CHANGE-ME --port 5556
  FLOWER_BASIC_AUTH=admin:CHANGE-ME toolfleet flower --address 0.0.0.0
  toolfleet flower --no-persistent                   # forget the task list at exit

Flower lists the calls made while a Flower watched (workers send task events only then),
kept across restarts in its state file; `toolfleet history BRANCH_ID` shows every call of a
branch. Exit codes: 0 stopped; 2 a bad option, a busy port or a broker that does not answer.
"""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``toolfleet flower`` to the ``toolfleet`` parser."""
    parser = subparsers.add_parser(
        "flower",
        help="start Flower, the web monitor, against the configured broker",
        description=(
            "Start Flower against TOOLFLEET_BROKER_URL (or the embedded default's Redis). "
            "Each tool call appears as a task named tool:<function> whose id is the call_id. "
            "Flower's /api/* needs --basic-auth (or FLOWER_UNAUTHENTICATED_API=true); "
            "/metrics and /healthcheck are always open. Any FLOWER_* environment variable "
            "(e.g. FLOWER_BASIC_AUTH=user:password) is applied too."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=5555, help="HTTP port (default 5555)")
    parser.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; use 0.0.0.0 only behind auth)",
    )
    parser.add_argument(
        "--basic-auth",
        metavar="USER:PASSWORD",
        action="append",
        default=None,
        help="require HTTP basic auth; repeat for several users (the password shows in ps: "
        "FLOWER_BASIC_AUTH=user:password keeps it off the command line)",
    )
    parser.add_argument(
        "--persistent",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"keep task history across restarts in <run dir>/{STATE_FILE_NAME} (default on)",
    )
    parser.add_argument(
        "--state-file",
        default=None,
        help=f"state file to use instead of <run dir>/{STATE_FILE_NAME}",
    )
    parser.add_argument(
        "--url-prefix",
        default=None,
        help="serve under this path, e.g. flower behind a reverse proxy at /flower",
    )
    parser.set_defaults(func=_run)


def resolve_broker_url(settings: Settings) -> str:
    """The broker Flower watches: TOOLFLEET_BROKER_URL, else the embedded default's Redis."""
    return _resolve(settings)[0]


def _resolve(settings: Settings) -> tuple[str, int | None]:
    """The broker URL and, for an embedded fleet, the pid of the toolfleet that runs it."""
    if settings.broker_url:
        return settings.broker_url, None
    for pid, embedded_url in live_fleets(settings):
        print(
            f"toolfleet flower: monitoring the embedded fleet of pid {pid} at "
            f"{masked_url(embedded_url)}; Flower stops when that fleet stops",
            file=sys.stderr,
        )
        return embedded_url, pid
    raise ConfigurationError(
        f"no broker to monitor: {ENV_PREFIX}BROKER_URL is unset and no embedded toolfleet "
        f"Redis is running; set {ENV_PREFIX}BROKER_URL=redis://host:6379/0 "
        "(a `toolfleet run` on the embedded default, while it runs, is found by itself)"
    )


def state_file(settings: Settings) -> Path:
    """Where ``--persistent`` keeps Flower's state: a file in the run directory."""
    return run_dir(settings) / STATE_FILE_NAME


def flower_argv(
    *,
    port: int,
    address: str,
    basic_auth: list[str] | None,
    persistent: bool,
    db_path: Path,
    url_prefix: str | None = None,
) -> list[str]:
    """Flower's own (tornado) options for these choices."""
    if not 0 < port < 65536:
        raise ConfigurationError(f"--port {port} is not a TCP port; pass 1-65535")
    argv = [f"--port={port}", f"--address={address}"]
    for credentials in basic_auth or ():
        # The value holds a password: name the user at most, never echo the value.
        user, sep, password = credentials.partition(":")
        if not sep or not user or not password:
            shown = f"for user {user!r}" if sep and user else "given"
            raise ConfigurationError(
                f"the --basic-auth value {shown} is not USER:PASSWORD; pass both, "
                "separated by a colon"
            )
        if "," in credentials:
            raise ConfigurationError(
                f"the --basic-auth value for user {user!r} contains a comma, which Flower "
                "reads as a list separator; choose a password without commas"
            )
    if basic_auth:
        # Flower's option takes one comma-separated list; a repeated flag would keep the last.
        argv.append(f"--basic_auth={','.join(basic_auth)}")
    argv.append(f"--persistent={persistent}")
    if persistent:
        argv += [f"--db={db_path}", f"--state_save_interval={_STATE_SAVE_INTERVAL_MS}"]
    if url_prefix:
        argv.append(f"--url_prefix={url_prefix}")
    return argv


def _run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    broker_url, fleet_pid = _resolve(settings)
    db_path = Path(args.state_file) if args.state_file else state_file(settings)
    if args.persistent:
        db_path.parent.mkdir(parents=True, exist_ok=True)
    argv = flower_argv(
        port=args.port,
        address=args.address,
        basic_auth=args.basic_auth,
        persistent=args.persistent,
        db_path=db_path,
        url_prefix=args.url_prefix,
    )
    has_auth = bool(args.basic_auth or os.environ.get("FLOWER_BASIC_AUTH"))
    if args.address not in _LOOPBACK and not has_auth:
        print(
            f"toolfleet flower: warning: listening on {args.address} without --basic-auth; "
            "anyone who reaches this port can see and revoke tasks",
            file=sys.stderr,
        )
    app = _celery_app(settings, broker_url)
    from toolfleet.workers.app import redis_url_of

    # Up front, so a wrong URL is one line and exit 2, not Flower retrying for minutes.
    redis_url = redis_url_of(app)
    check_reachable(redis_url, broker_url)
    ask_every_sentinel(redis_url)
    _serve(app, argv, fleet_pid=fleet_pid, settings=settings, port=args.port, address=args.address)
    # Flower's executor threads may be stuck reconnecting to a broker that is gone, and the
    # interpreter would wait for them at exit: the state is saved, so leave now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(
    celery_app: Any,
    argv: list[str],
    *,
    fleet_pid: int | None = None,
    settings: Settings | None = None,
    port: int = 0,
    address: str = "",
) -> None:
    """What ``celery flower`` does, with our app object instead of one found by ``-A``;
    returns on SIGTERM, SIGINT or (for an embedded fleet) when that fleet's toolfleet ends."""
    server = FlowerServer(celery_app, argv)
    try:
        bound_port = server.listen()
    except OSError as exc:
        raise ConfigurationError(
            f"--port {port} on {address} cannot be used ({exc.strerror or exc}); pass a free "
            "--port, or stop what listens there"
        ) from None
    if fleet_pid is not None:
        _stop_with_fleet(server, fleet_pid, settings)
    options = server.options
    print(
        f"toolfleet flower: listening on http://{options.address}:{bound_port}/ "
        f"(state: {options.db if options.persistent else 'not persisted'})",
        file=sys.stderr,
        flush=True,
    )
    server.run()


def _stop_with_fleet(server: FlowerServer, fleet_pid: int, settings: Settings | None) -> None:
    """Stop Flower's loop once the embedded fleet it watches has stopped (its toolfleet
    removes the fleet's broker_url as it stops, or is gone)."""

    def check() -> None:
        if fleet_pid not in dict(live_fleets(settings)):
            print(
                f"toolfleet flower: the embedded fleet of pid {fleet_pid} stopped; stopping",
                file=sys.stderr,
                flush=True,
            )
            server.stop_loop()

    server.every(500, check)


def _celery_app(settings: Settings, broker_url: str) -> Any:
    """The workers' Celery app configuration, pointed at ``broker_url``."""
    resolved = settings.model_copy(update={"broker_url": broker_url})
    from toolfleet.workers.app import create_app

    return create_app(resolved)
