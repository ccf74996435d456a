"""``toolfleet mcp``: serve the fleet's tools to any MCP client (stdio or streamable HTTP).

Needs the extra ``toolfleet[mcp]``; the rest of the command line works without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import ipaddress
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from toolfleet.cli.mcp_stdio import ProtocolStdio, claim_stdio
from toolfleet.cli.tool_modules import add_tools_option, load_tool_modules, tool_modules
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.errors import ConfigurationError, ToolfleetError

__all__ = ["load_gate", "register"]

DEFAULT_PORT = 8765

_EPILOG = """\
Examples:
  toolfleet mcp --tools mytools                                   # stdio, for a desktop assistant
  toolfleet mcp --tools mytools --transport http --port 8765      # http://127.0.0.1:8765/mcp
  MCP_TOKEN=s3cret toolfleet mcp --tools mytools --transport http --token-env MCP_TOKEN

With TOOLFLEET_BROKER_URL unset, a private Redis and one sync and one async worker are started
and stopped with the server (the embedded default). A client that declares MCP Tasks gets a
task for each tools/call, which any replica of the fleet answers for (docs/mcp.md, --no-tasks).
Each MCP session's calls go to one branch:
`toolfleet history <branch_id>` (the id is in each result's _meta "toolfleet/branch_id").
SIGTERM or Ctrl-C stops the server: calls in flight are cancelled, the fleet's clients closed.
Exit codes: 0 stopped; 2 bad option, no tool module, or the mcp extra is not installed.
"""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``toolfleet mcp`` to the ``toolfleet`` parser."""
    parser = subparsers.add_parser(
        "mcp",
        help="serve the fleet's tools to MCP clients (stdio or HTTP)",
        description="An MCP server listing the registry's tools; each tools/call runs as a "
        "call on the fleet, with its history, its record and its row in Flower.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_tools_option(parser)
    transport = "stdio (default): the client's pipes; http: Streamable HTTP at HOST:PORT/mcp"
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio", help=transport)
    parser.add_argument(
        "--host", default="127.0.0.1", help="HTTP: address to bind (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"HTTP: port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--token-env",
        metavar="VAR",
        help="HTTP: require 'Authorization: Bearer <token>', the token read from env var VAR",
    )
    parser.add_argument(
        "--gate",
        action="append",
        metavar="MODULE:NAME",
        default=[],
        help="a session gate (a callable taking a ToolInvocation) or a PermissionPolicy; "
        "repeatable. A denied call is a tool result saying so",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=None, help="per-call timeout (default: the tool's)"
    )
    parser.add_argument(
        "--task-ttl-s", type=float, help="MCP Tasks: how long a task is kept (default a day)"
    )
    parser.add_argument(
        "--no-tasks",
        action="store_true",
        help="do not offer MCP Tasks: every tools/call is answered when the call ends",
    )
    parser.set_defaults(func=_main)


def load_gate(spec: str) -> Any:
    """The gate named ``MODULE:NAME``; a PermissionPolicy becomes its ``as_gate()``."""
    from toolfleet.dispatcher.govern.permissions import PermissionPolicy

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"--gate {spec!r} is not MODULE:NAME (e.g. mygates:no_deletes)")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"--gate {spec!r} cannot be loaded: {exc}") from None
    if isinstance(target, PermissionPolicy):
        return target.as_gate()
    if not callable(target):
        raise ConfigurationError(
            f"--gate {spec!r} is a {type(target).__name__}; name a callable taking a "
            "ToolInvocation, or a PermissionPolicy"
        )
    return target


def _main(args: argparse.Namespace) -> int:
    try:
        return _serve_command(args)
    except ToolfleetError as exc:
        print(f"toolfleet mcp: {exc}", file=sys.stderr)
        return 2


def _serve_command(args: argparse.Namespace) -> int:
    from toolfleet.schemas.settings import Settings

    # First: from here on, only the protocol writes to the real stdout.
    protocol = claim_stdio() if args.transport == "stdio" else None
    settings = Settings.from_env()
    tools = tool_modules(settings.tools, args.tools)
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            "the MCP server needs the mcp package: pip install 'toolfleet[mcp]'"
        ) from None
    token = _token(args)
    if args.transport == "http" and token is None and not _is_loopback(args.host):
        print(
            f"toolfleet mcp: warning: serving on {args.host} without a bearer token; anyone "
            "who reaches it can run your tools (pass --token-env VAR)",
            file=sys.stderr,
        )
    load_tool_modules(tools)
    gates = [load_gate(spec) for spec in args.gate]
    params = CallParams(timeout_s=args.timeout_s) if args.timeout_s else None

    if args.transport == "http":
        _check_port_free(args.host, args.port)  # before any fleet starts
    from toolfleet.broker import tracing
    from toolfleet.embedded import resolve_fleet

    tracing.configure_from_env("toolfleet-mcp", console=sys.stderr if protocol else None)
    if not settings.broker_url:
        print(
            "toolfleet mcp: TOOLFLEET_BROKER_URL is unset: starting the embedded default "
            "(a private Redis and two local workers)",
            file=sys.stderr,
        )
    with resolve_fleet(tools) as fleet_settings:
        try:
            asyncio.run(
                _serve(
                    fleet_settings,
                    transport=args.transport,
                    host=args.host,
                    port=args.port,
                    token=token,
                    gates=gates,
                    call_params=params,
                    protocol=protocol,
                    tasks=not args.no_tasks,
                    task_ttl_ms=round(args.task_ttl_s * 1000) if args.task_ttl_s else None,
                )
            )
        except KeyboardInterrupt:
            pass
    return 0


def _check_port_free(host: str, port: int) -> None:
    """A busy or unbindable --port is one line naming it (exit 2), not a server error later."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except (OSError, OverflowError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ConfigurationError(
                f"--port {port} on {host} cannot be used ({reason}); pass a free --port, or "
                "stop what listens there"
            ) from None


async def _serve(
    settings: Any,
    *,
    transport: str,
    host: str,
    port: int,
    token: str | None,
    gates: Sequence[Any],
    call_params: CallParams | None,
    protocol: ProtocolStdio | None = None,
    tasks: bool = True,
    task_ttl_ms: int | None = None,
) -> None:
    from toolfleet.adapters.mcp import FleetMcpServer
    from toolfleet.dispatcher.fleet import Fleet

    fleet = Fleet(settings)
    stop = _Stop()
    bridge = FleetMcpServer(
        fleet, gates=gates, call_params=call_params, tasks=tasks, task_ttl_ms=task_ttl_ms
    )
    with _on_stop_signals(stop):
        try:
            server = bridge.server
            if transport == "stdio":
                import anyio
                from mcp.server.stdio import stdio_server

                with anyio.CancelScope() as serving:
                    stop.then(serving.cancel)
                    streams = protocol.streams() if protocol is not None else ()
                    async with stdio_server(*streams) as (read, write):
                        await server.run(read, write, server.create_initialization_options())
            else:
                await _serve_http(server, host, port, token, stop)
        finally:
            if bridge.tasks is not None:
                await bridge.tasks.aclose()
            await fleet.aclose()
    if stop.signals:
        print(
            f"toolfleet mcp: stopped by {stop.signals[0]}; the fleet's clients are closed",
            file=sys.stderr,
            flush=True,
        )


async def _serve_http(server: Any, host: str, port: int, token: str | None, stop: _Stop) -> None:
    import uvicorn

    from toolfleet.adapters.mcp import require_bearer

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises a captured SIGTERM once it has shut down, which kills the
            # process (exit 143) before the fleet is closed; _on_stop_signals has it instead.
            yield

    app: Any = server.streamable_http_app(host=host)
    if token is not None:
        app = require_bearer(app, token)
    print(f"toolfleet mcp: serving http://{host}:{port}/mcp", file=sys.stderr, flush=True)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        # An open stream (a client's GET) would hold the shutdown forever.
        timeout_graceful_shutdown=STOP_GRACE_S,
    )
    web = _Server(config)

    def shut_down() -> None:
        web.force_exit = web.should_exit  # a second signal: stop waiting for requests
        web.should_exit = True

    stop.then(shut_down)
    await web.serve()


class _Stop:
    """A SIGTERM or SIGINT: noted, and passed to what stops the server once it runs."""

    def __init__(self) -> None:
        self.signals: list[str] = []
        self._action: Callable[[], None] | None = None

    def __call__(self, signum: int) -> None:
        self.signals.append(signal.Signals(signum).name)
        if self._action is not None:
            self._action()

    def then(self, action: Callable[[], None]) -> None:
        """Run ``action`` on each signal from now on (at once if one came already)."""
        self._action = action
        if self.signals:
            action()


# HTTP: how long a stop waits for requests in flight before cancelling them.
STOP_GRACE_S = 5


@contextlib.contextmanager
def _on_stop_signals(stop: Callable[[int], None]) -> Iterator[None]:
    """Call ``stop(signum)`` on SIGTERM (docker, systemd) and SIGINT while serving, instead
    of dying with 143 or a KeyboardInterrupt halfway through; the previous handlers (the
    embedded fleet's, asyncio's) come back afterwards."""
    loop = asyncio.get_running_loop()
    installed: list[tuple[signal.Signals, Any]] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        try:
            loop.add_signal_handler(signum, stop, signum)
        except (ValueError, RuntimeError, NotImplementedError):
            continue  # not the main thread, or no signals here: the default stays
        installed.append((signum, previous))
    try:
        yield
    finally:
        for signum, previous in installed:
            loop.remove_signal_handler(signum)
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, previous)


def _token(args: argparse.Namespace) -> str | None:
    if args.token_env is None:
        return None
    if args.transport != "http":
        raise ConfigurationError("--token-env applies to --transport http only")
    token = os.environ.get(args.token_env, "").strip()
    if not token:
        raise ConfigurationError(
            f"--token-env {args.token_env}: that environment variable is unset or empty; "
            "set it to the bearer token clients must send"
        )
    return token


def _is_loopback(host: str) -> bool:
    with contextlib.suppress(ValueError):  # not an address, nor localhost: not loopback
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    return False
