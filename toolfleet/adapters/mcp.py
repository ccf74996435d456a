"""An MCP server whose tools are the fleet's: each ``tools/call`` is one call on the fleet.

The official ``mcp`` package (extra ``toolfleet[mcp]``) speaks the protocol; this module maps it
onto toolfleet: ``tools/list`` is ``registry.specs(format="mcp")`` plus each tool's annotations
(its ``@tool`` flags) and, when its return annotation is an object type, an ``outputSchema``;
``tools/call`` is ``branch.act([call])`` on the branch of the caller's MCP session, a dict output
is also the result's ``structuredContent``, a tool failure or a denied call is a result with
``isError`` (never a protocol error), and a client's ``notifications/cancelled`` cancels the
act(), which cancels the call on the fleet (C9). When the request carries a progress token,
the tool's ``current_call().progress()`` reports become ``notifications/progress`` for it
(without one, the call asks its worker for none). A client that declares the MCP Tasks
extension on its ``tools/call`` gets a task instead (``toolfleet.adapters.mcp_tasks``).
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import anyio
from pydantic import TypeAdapter, ValidationError

from toolfleet.schemas.errors import ConfigurationError

try:
    import mcp_types as types
    from mcp.server.lowlevel import Server
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"the MCP SDK is not installed ({exc}); pip install 'toolfleet[mcp]'"
    ) from exc

from toolfleet.adapters.mcp_tasks import FleetTasks
from toolfleet.dispatcher.batch.progress_relay import ProgressCallback
from toolfleet.dispatcher.batch.units import DENIED_OUTPUT_ERROR
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.session_signals import GateDenied
from toolfleet.dispatcher.session import Gate, Session
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.progress import CallProgress
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tool import Tool

__all__ = [
    "BRANCH_META_KEY",
    "CALL_META_KEY",
    "FleetMcpServer",
    "ToolOutput",
    "require_bearer",
    "tool_annotations",
    "tool_output",
]

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
        tasks: bool = True,
        task_ttl_ms: int | None = None,
    ) -> None:
        self.fleet = fleet
        self.call_params = call_params
        self.session = Session(fleet)
        for gate in gates:
            self.session.gate(gate)
        # One branch per MCP session: its calls' history in one place (see branch_for).
        self._branches: OrderedDict[str | None, Branch] = OrderedDict()
        self._outputs: dict[str, ToolOutput | None] = {}
        self.server: Server[Any] = Server(
            name,
            instructions="Each tool runs as a call on a toolfleet fleet of Celery workers.",
            on_list_tools=self._list_tools,
            # Any: a task is a claimed result (resultType "task"), outside the SDK's union.
            on_call_tool=cast(Any, self._call_tool),
        )
        # The tasks extension (toolfleet.adapters.mcp_tasks): for clients that declare it.
        self.tasks = FleetTasks(fleet, self._render_for, ttl_ms=task_ttl_ms) if tasks else None
        if self.tasks is not None:
            self.tasks.install(self.server)

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
        registry = self.fleet.registry
        tools = []
        for spec in registry.specs("mcp"):
            tool = registry.get(spec["name"])
            output = self._output(tool)
            tools.append(
                types.Tool(
                    name=spec["name"],
                    description=spec.get("description") or None,
                    input_schema=spec["inputSchema"],
                    output_schema=output.schema if output is not None else None,
                    annotations=tool_annotations(tool),
                )
            )
        return types.ListToolsResult(tools=tools)

    def _output(self, tool: Tool) -> ToolOutput | None:
        if tool.function not in self._outputs:
            self._outputs[tool.function] = tool_output(tool)
        return self._outputs[tool.function]

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | dict[str, Any]:
        branch = self.branch_for(ctx)
        if params.name not in self.fleet.registry:
            known = ", ".join(self.fleet.registry.names()) or "none"
            return _error_result(
                f"unknown tool {params.name!r}; this server's tools are: {known}", branch, None
            )
        if self.tasks is not None and self.tasks.declared(ctx):
            return await self.tasks.create(ctx, branch, params, self.call_params)
        request = {"function": params.name, "arguments": dict(params.arguments or {})}
        act = asyncio.ensure_future(
            branch.act([request], call_params=self.call_params, on_progress=_progress_to(ctx))
        )
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

    def _render_for(self, result: ActionResponseModel, branch_id: str) -> types.CallToolResult:
        """:meth:`_render` for a call of the branch ``branch_id`` (a task's, read back)."""
        branch = self.session.branches.get(branch_id)
        return self._render(result, branch if branch is not None else _BranchRef(branch_id))

    def _render(
        self, result: ActionResponseModel, branch: Branch | _BranchRef
    ) -> types.CallToolResult:
        call_id = str(result.call_id) if result.call_id else None
        if result.status is EventStatus.COMPLETED:
            output = result.output
            structured = output if isinstance(output, dict) else None
            declared = (
                self._output(self.fleet.registry.get(result.function))
                if result.function in self.fleet.registry
                else None
            )
            if declared is not None:
                try:
                    structured = declared.dump(output)
                except ValidationError as exc:
                    # A client checks structuredContent against the outputSchema announced.
                    return _error_result(
                        f"tool {result.function!r} completed, but its output does not match "
                        f"its declared return type {declared.annotation_text}: "
                        f"{_first_error(exc)}; output: {_text(output)[:2000]}",
                        branch,
                        call_id,
                    )
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=_text(output))],
                structured_content=structured,
                is_error=False,
                _meta=_meta(branch, call_id),
            )
        if result.status is EventStatus.SKIPPED and result.error != DENIED_OUTPUT_ERROR:
            # Denied by its approver, or not decided in time: who, and why, as the model reads.
            return _error_result(result.error or "not approved; it did not run", branch, call_id)
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


@dataclass(frozen=True)
class _BranchRef:
    """A branch known by its id only (a task's, read back by another process)."""

    id: str
    signals: tuple[Any, ...] = ()


def _progress_to(ctx: Any) -> ProgressCallback | None:
    """A progress callback sending ``notifications/progress`` for the request of ``ctx``,
    when its client sent a progress token; None otherwise (nobody listens)."""
    meta = getattr(ctx, "meta", None) or {}
    session = getattr(ctx, "session", None)
    if meta.get("progress_token") is None or session is None:
        return None

    async def report(progress: CallProgress) -> None:
        await session.report_progress(progress.done, progress.total, progress.message)

    return report


def tool_annotations(tool: Tool) -> types.ToolAnnotations:
    """The MCP annotations of ``tool``, from its ``@tool`` flags: ``readOnlyHint`` and
    ``idempotentHint`` always; ``destructiveHint`` and ``openWorldHint`` when declared
    (undeclared, a client assumes true)."""
    return types.ToolAnnotations(
        read_only_hint=tool.read_only,
        destructive_hint=tool.destructive,
        idempotent_hint=tool.idempotent,
        open_world_hint=tool.open_world,
    )


@dataclass(frozen=True)
class ToolOutput:
    """A tool's declared output: the JSON Schema (an object) and how to check a value."""

    schema: dict[str, Any]
    adapter: TypeAdapter[Any]
    annotation_text: str

    def dump(self, output: Any) -> Any:
        """``output`` (as the fleet returned it, JSON) checked against the declared type and
        dumped as JSON again; ValidationError when it does not match."""
        value = self.adapter.validate_python(output, by_alias=True, by_name=True)
        return self.adapter.dump_python(value, mode="json", by_alias=True)


def tool_output(tool: Tool) -> ToolOutput | None:
    """``tool``'s declared output when its return annotation is an object type (a dict, a
    pydantic model, a dataclass, a TypedDict from typing_extensions); None otherwise. The
    annotation read is the postprocessor's when the tool has one: what it returns is the
    tool's output.

    An object schema only: MCP's ``outputSchema`` must be ``type: object`` (through the
    2025-11-25 protocol), and a number or a list is not wrapped as ``{"result": ...}`` as the
    SDK's MCPServer does, so that ``structuredContent`` is the tool's output itself, the value
    its history records."""
    func = tool.postprocessor or tool.func_callable
    try:
        annotation = inspect.signature(func, eval_str=True).return_annotation
    except (TypeError, ValueError, NameError, SyntaxError):
        return None
    if annotation in (inspect.Signature.empty, Any, None, type(None)):
        return None
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        schema = adapter.json_schema(mode="serialization")
    except Exception:  # pydantic cannot describe it (an arbitrary class): no schema
        return None
    schema = _inline_root_ref(schema)
    if schema.get("type") != "object":
        return None
    return ToolOutput(schema, adapter, _annotation_text(annotation))


def _inline_root_ref(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema whose root is a ``$ref`` (a recursive model) with that definition inlined."""
    ref = schema.get("$ref")
    defs = schema.get("$defs") or {}
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return schema
    target = defs.get(ref.removeprefix("#/$defs/"))
    if not isinstance(target, dict):
        return schema
    return {**target, "$defs": defs}


def _annotation_text(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _first_error(exc: ValidationError) -> str:
    (first, *_) = exc.errors()
    where = ".".join(str(p) for p in first["loc"]) or "the output"
    return f"{where}: {first['msg']}"


def _text(output: Any) -> str:
    if isinstance(output, str):
        return output
    try:
        return json.dumps(output, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(output)


def _meta(branch: Branch | _BranchRef, call_id: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {BRANCH_META_KEY: branch.id}
    if call_id:
        meta[CALL_META_KEY] = call_id
    return meta


def _error_result(
    text: str, branch: Branch | _BranchRef, call_id: str | None
) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        is_error=True,
        _meta=_meta(branch, call_id),
    )


ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def require_bearer(app: ASGIApp, token: str) -> ASGIApp:
    """Wrap an ASGI app so every HTTP request must carry ``Authorization: Bearer <token>``.

    The scheme is case-insensitive (``bearer``, ``BEARER``: RFC 9110 section 11.1); the token is
    compared exactly, in constant time."""
    expected = token.encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, credentials = given.strip().partition(b" ")
            if not (
                scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), expected)
            ):
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
