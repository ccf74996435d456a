"""An MCP server whose tools are the fleet's: each ``tools/call`` is one call on the fleet.

The official ``mcp`` package (extra ``toolfleet[mcp]``) speaks the protocol; this module maps it
onto toolfleet: ``tools/list`` is ``registry.specs(format="mcp")``, ``tools/call`` is
``branch.act([call])`` on the branch of the caller's MCP session, a tool failure or a denied call
is a result with ``isError`` (never a protocol error), and a client's ``notifications/cancelled``
cancels the act(), which cancels the call on the fleet (C9).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.session import Gate, Session
from toolfleet.dispatcher.govern.session_signals import GateDenied
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.status import EventStatus

__all__ = ["BRANCH_META_KEY", "CALL_META_KEY", "FleetMcpServer", "require_bearer"]

log = logging.getLogger(__name__)

# Result `_meta` keys: where the call is on the fleet (`toolfleet history <branch_id>`).
BRANCH_META_KEY = "toolfleet/branch_id"
CALL_META_KEY = "toolfleet/call_id"
# How long a cancelled call may take to be recorded CANCELLED on the fleet before the
# handler gives up waiting (the recording goes on; only the wait ends).
CANCEL_GRACE_S = 30.0
SESSION_HEADER = "mcp-session-id"
# Branches kept in memory for live sessions; the oldest is forgotten past this many.
MAX_SESSIONS = 1000


class FleetMcpServer:
    """The MCP server of one fleet. ``server`` is the ``mcp`` low-level Server to run."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        gates: Sequence[Gate] = (),
        call_params: CallParams | None = None,
        name: str = "toolfleet",
    ) -> None:
        self.fleet = fleet
        self.call_params = call_params
        self.session = Session(fleet)
        for gate in gates:
            self.session.gate(gate)
        # One branch per MCP session: its calls' history in one place (see branch_for).
        self._branches: OrderedDict[str | None, Branch] = OrderedDict()
        self.server: Server[Any] = Server(
            name,
            instructions="Each tool runs as a call on a toolfleet fleet of Celery workers.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    def branch_for(self, ctx: Any) -> Branch:
        """The branch of the MCP session ``ctx`` belongs to (created on its first call).

        A streamable-HTTP session is named by its ``Mcp-Session-Id`` header. Requests with no
        session share the server's own branch: a stdio server's one client, and clients of
        the sessionless (2026-07-28) HTTP protocol.
        """
        request = getattr(ctx, "request", None)
        headers = getattr(request, "headers", None)
        session_id = headers.get(SESSION_HEADER) if headers is not None else None
        branch = self._branches.get(session_id)
        if branch is None:
            branch = self._branches[session_id] = self.session.new_branch()
            log.info("MCP session %s: branch %s", session_id or "(none)", branch.id)
            while len(self._branches) > MAX_SESSIONS:
                # Only the cache forgets: the branch's history stays in Redis.
                _, forgotten = self._branches.popitem(last=False)
                self.session.branches.pop(forgotten.id, None)
        else:
            self._branches.move_to_end(session_id)
        return branch

    async def _list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        specs = self.fleet.registry.specs("mcp")
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=spec["name"],
                    description=spec.get("description") or None,
                    input_schema=spec["inputSchema"],
                )
                for spec in specs
            ]
        )

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        branch = self.branch_for(ctx)
        if params.name not in self.fleet.registry:
            known = ", ".join(self.fleet.registry.names()) or "none"
            return _error_result(
                f"unknown tool {params.name!r}; this server's tools are: {known}", branch, None
            )
        request = {"function": params.name, "arguments": dict(params.arguments or {})}
        act = asyncio.ensure_future(branch.act([request], call_params=self.call_params))
        try:
            # Shielded, so the client's cancel reaches act() once, below, not at every
            # await while it records the call CANCELLED on the fleet.
            (result,) = await asyncio.shield(act)
        except asyncio.CancelledError:
            act.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_GRACE_S):
                await asyncio.wait([act])
            raise
        return self._render(result, branch)

    def _render(self, result: ActionResponseModel, branch: Branch) -> types.CallToolResult:
        call_id = str(result.call_id) if result.call_id else None
        if result.status is EventStatus.COMPLETED:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=_text(result.output))],
                is_error=False,
                _meta=_meta(branch, call_id),
            )
        if result.status is EventStatus.SKIPPED:
            reason = next(
                (
                    s.reason
                    for s in reversed(branch.signals)
                    if isinstance(s, GateDenied) and s.call_id == call_id
                ),
                None,
            )
            why = f" ({reason})" if reason else ""
            return _error_result(
                f"call of tool {result.function!r} was denied by the governance gate{why}; "
                "it did not run",
                branch,
                call_id,
            )
        return _error_result(
            f"tool {result.function!r} {result.status.value}: {result.error}", branch, call_id
        )


def _text(output: Any) -> str:
    if isinstance(output, str):
        return output
    try:
        return json.dumps(output, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(output)


def _meta(branch: Branch, call_id: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {BRANCH_META_KEY: branch.id}
    if call_id:
        meta[CALL_META_KEY] = call_id
    return meta


def _error_result(text: str, branch: Branch, call_id: str | None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        is_error=True,
        _meta=_meta(branch, call_id),
    )


ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def require_bearer(app: ASGIApp, token: str) -> ASGIApp:
    """Wrap an ASGI app so every HTTP request must carry ``Authorization: Bearer <token>``."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                body = b'{"error": "missing or wrong bearer token"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded
