"""MCP Tasks (the ``io.modelcontextprotocol/tasks`` extension) on the fleet.

A ``tools/call`` whose request declares the extension in its ``_meta`` client capabilities
(2026-07-28 protocol) is answered with a ``CreateTaskResult`` once the call is durably on the
fleet: parked for approval, or published with its batch's journal, or already ended. The call is
an ordinary ``Branch.act()`` call of the session's branch, run on in this process; the task's
state lives in Redis (``toolfleet.adapters.mcp_task_store``) and is read from the call's records
(``toolfleet.adapters.mcp_task_state``), so any ``toolfleet mcp`` of the fleet answers
``tasks/get``, ``tasks/update`` and ``tasks/cancel`` for it. A client that does not declare the
extension gets today's synchronous answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import mcp_types as types
import redis
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import decode_header_value
from mcp_types.jsonrpc import HEADER_MISMATCH, INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field

from toolfleet.adapters.mcp_task_listen import ListenParams, listen_to_tasks
from toolfleet.adapters.mcp_task_progress import progress_writer
from toolfleet.adapters.mcp_task_state import (
    POLL_INTERVAL_MS,
    approval_key,
    cancel_orphan,
    iso,
    on_the_fleet,
    task_view,
)
from toolfleet.adapters.mcp_task_store import CREATOR_BEAT_S, TaskRecord, TaskStore, owner_of
from toolfleet.dispatcher.accept.context import call_id_for
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.approvals import expire, load_approval
from toolfleet.dispatcher.govern.hooks import HookPoint
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.errors import ApprovalError
from toolfleet.schemas.status import EventStatus

__all__ = ["TASKS_EXTENSION", "FleetTasks"]

log = logging.getLogger(__name__)

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
# How long tools/call waits for the call to be durably on the fleet before it answers
# with an error instead of a task.
ENQUEUE_WAIT_S = 30.0
# How long a cancelled act() may take to record its call CANCELLED before the wait ends.
CANCEL_GRACE_S = 30.0

Render = Callable[[ActionResponseModel, str], types.CallToolResult]


class TaskParams(types.RequestParams):
    """``tasks/get`` and ``tasks/cancel``: the task's id."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskParams):
    """``tasks/update``: the id and the answers to the task's input requests."""

    input_responses: dict[str, Any] = Field(alias="inputResponses", default_factory=dict)


class FleetTasks:
    """The tasks extension of one ``FleetMcpServer``: creation and the ``tasks/*`` methods."""

    def __init__(self, fleet: Fleet, render: Render, *, ttl_ms: int | None = None) -> None:
        self.fleet = fleet
        self.render = render
        self.ttl_ms = ttl_ms
        # call_id -> the act() running it in this process (for tasks/cancel).
        self._running: dict[str, asyncio.Future[Any]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._listener: asyncio.Task[None] | None = None
        # call ids whose act() this process cancelled for tasks/cancel.
        self._cancelled: set[str] = set()
        # call ids being created that passed their gate and TOOL_PRE hooks, and the branches
        # whose TOOL_PRE hooks note them (see _on_the_fleet).
        self._past_pre_hooks: set[str] = set()
        self._branches_marked: weakref.WeakSet[Branch] = weakref.WeakSet()

    def install(self, server: Server[Any]) -> None:
        """Advertise the extension and serve its methods on ``server``."""
        server.extensions[TASKS_EXTENSION] = {}
        server.add_request_handler("tasks/get", TaskParams, self._get)
        server.add_request_handler("tasks/update", UpdateParams, self._update)
        server.add_request_handler("tasks/cancel", TaskParams, self._cancel)
        server.add_request_handler("subscriptions/listen", ListenParams, self._listen)

    @property
    def store(self) -> TaskStore:
        return TaskStore(self.fleet.redis, self.fleet.keys)

    @staticmethod
    def declared(ctx: Any) -> bool:
        """Whether this request's client declared the extension (2026-07-28 protocol only:
        an older client cannot read a task)."""
        if getattr(ctx, "protocol_version", None) not in MODERN_PROTOCOL_VERSIONS:
            return False
        meta = getattr(ctx, "meta", None) or {}
        capabilities = meta.get(CLIENT_CAPABILITIES) or {}
        extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
        return isinstance(extensions, dict) and TASKS_EXTENSION in extensions

    async def create(
        self,
        ctx: Any,
        branch: Branch,
        params: types.CallToolRequestParams,
        call_params: CallParams | None,
    ) -> dict[str, Any] | types.CallToolResult:
        """Start the call and answer with its task once the call is durably on the fleet; a
        call that ended before (a gate's denial) is answered as a plain result."""
        await self._listen_for_cancels()
        if branch not in self._branches_marked:
            branch.hooks.on(HookPoint.TOOL_PRE, self._mark_past_pre_hooks)
            self._branches_marked.add(branch)
        tool_call_id = f"mcp-task-{uuid.uuid4().hex}"
        call_id = call_id_for(branch.id, tool_call_id)
        store = self.store
        record = await store.create(
            call_id=call_id,
            function=params.name,
            branch_id=branch.id,
            dispatcher_id=self.fleet.collector_id,
            owner=owner_of(_header(ctx, "authorization")),
            ttl_ms=self.ttl_ms,
        )
        request = {
            "id": tool_call_id,
            "function": params.name,
            "arguments": dict(params.arguments or {}),
        }
        act = asyncio.ensure_future(
            branch.act(
                [request],
                call_params=call_params,
                on_progress=progress_writer(lambda: self.store, record, self._background),
            )
        )
        self._running[call_id] = act
        runner = asyncio.ensure_future(self._run_to_end(record, act))
        self._background.add(runner)
        runner.add_done_callback(self._background.discard)
        try:
            durable = await self._durable(record, act)
            refused = act.done() and not await self._on_the_fleet(record)
        finally:
            self._past_pre_hooks.discard(call_id)
        if not durable:
            runner.cancel()
            await self.fleet.redis.delete(store.key(record.task_id))
            raise MCPError(code=-32603, message="the call could not be enqueued on the fleet")
        if refused:
            # Refused before it was enqueued (a gate's denial): nothing to wait for.
            (result,) = act.result()
            await self.fleet.redis.delete(store.key(record.task_id))
            return self.render(result, branch.id)
        return {
            "resultType": "task",
            "taskId": record.task_id,
            "status": "working",
            "createdAt": iso(record.created_at),
            "lastUpdatedAt": iso(record.updated_at),
            "ttlMs": record.ttl_ms,
            "pollIntervalMs": POLL_INTERVAL_MS,
        }

    def _mark_past_pre_hooks(self, payload: dict[str, Any]) -> None:
        self._past_pre_hooks.add(payload["call_id"])

    async def _durable(self, record: TaskRecord, act: asyncio.Future[Any]) -> bool:
        """Wait until the call is parked, published with its journal, or ended (bounded)."""
        deadline = time.monotonic() + ENQUEUE_WAIT_S
        delay = 0.005
        while time.monotonic() < deadline:
            if act.done():
                return not act.cancelled() and act.exception() is None
            if await self._on_the_fleet(record):
                return True
            await asyncio.wait([act], timeout=delay)
            delay = min(delay * 2, 0.1)
        return False

    async def _on_the_fleet(self, record: TaskRecord) -> bool:
        return await on_the_fleet(
            self.fleet, record, past_pre_hooks=record.call_id in self._past_pre_hooks
        )

    async def _run_to_end(self, record: TaskRecord, act: asyncio.Future[Any]) -> None:
        """Await the act() and store the task's end as this process saw it."""
        store = self.store
        try:
            try:
                (result,) = await asyncio.shield(act)
            except asyncio.CancelledError:
                act.cancel()
                # asyncio.wait neither raises the act's outcome nor cancels it on time-out.
                await asyncio.wait({act}, timeout=CANCEL_GRACE_S)
                if act.cancelled() or record.call_id in self._cancelled:
                    await store.finish(record.task_id, "cancelled", None)
                    return
                (result,) = act.result()
            except Exception as exc:
                log.exception("task of call %s failed", record.call_id)
                await store.finish(
                    record.task_id, "failed", {"code": -32603, "message": str(exc)[:2000]}
                )
                return
            if result.status is EventStatus.CANCELLED:
                await store.finish(record.task_id, "cancelled", None)
                return
            rendered = self.render(result, record.branch_id)
            await store.finish(
                record.task_id,
                "completed",
                rendered.model_dump(by_alias=True, mode="json", exclude_none=True),
            )
        except (redis.RedisError, OSError) as exc:
            log.warning("task of call %s: its end was not stored: %r", record.call_id, exc)
        finally:
            self._running.pop(record.call_id, None)
            self._cancelled.discard(record.call_id)

    # -- the tasks/* methods ---------------------------------------------------------------

    async def _load(self, ctx: Any, task_id: str) -> TaskRecord:
        if not self.declared(ctx):
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message=f"tasks/* requests must declare the {TASKS_EXTENSION} extension in "
                "_meta clientCapabilities.extensions",
                data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        routed = _header(ctx, "mcp-name")
        if routed is not None and decode_header_value(routed) != task_id:
            raise MCPError(
                code=HEADER_MISMATCH,
                message="the Mcp-Name header must be the request's taskId (an intermediary "
                "routes on it)",
            )
        record = await self.store.load(task_id, owner_of(_header(ctx, "authorization")))
        if record is None:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"Failed to retrieve task: task {task_id[:64]!r} not found (unknown, "
                "expired, or created with other credentials)",
            )
        return record

    async def _get(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        record = await self._load(ctx, params.task_id)
        view = await task_view(self.fleet, self.store, record, self.render)
        return {"resultType": "complete", **view}

    async def _listen(self, ctx: Any, params: ListenParams) -> dict[str, Any]:
        owner = owner_of(_header(ctx, "authorization"))
        store = self.store

        async def load(task_id: str) -> TaskRecord | None:
            return await store.load(task_id, owner)

        async def view(record: TaskRecord) -> dict[str, Any]:
            return await task_view(self.fleet, store, record, self.render)

        return await listen_to_tasks(ctx, params, declared=self.declared(ctx), load=load, view=view)

    async def _update(self, ctx: Any, params: UpdateParams) -> dict[str, Any]:
        record = await self._load(ctx, params.task_id)
        answer = params.input_responses.get(approval_key(record.call_id))
        if isinstance(answer, dict):
            await self._decide(record, answer)
        # Keys not outstanding are ignored, as the extension says.
        return {"resultType": "complete"}

    async def _decide(self, record: TaskRecord, answer: dict[str, Any]) -> None:
        action = answer.get("action")
        given = answer.get("content")
        content: dict[str, Any] = given if isinstance(given, dict) else {}
        reason = str(content.get("reason") or "").strip() or None
        by = "an MCP client's user"
        try:
            if action == "accept" and content.get("approve") is True:
                await self.fleet.approve(record.call_id, by=by, reason=reason)
            elif action == "accept" or action == "decline":
                await self.fleet.deny(
                    record.call_id, reason or "declined by the MCP client's user", by=by
                )
            # "cancel": the person dismissed the question; the call waits on.
        except ApprovalError as exc:
            log.info("task of call %s: %s", record.call_id, exc)  # decided already: it stands

    async def _cancel(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        record = await self._load(ctx, params.task_id)
        store = self.store
        await store.annotate(record.task_id, cancel_requested="1")
        await self.fleet.redis.publish(store.cancel_channel(), record.call_id)
        self._cancel_local(record.call_id)
        # A call still parked is ended here too, whoever parked it (idempotent: first wins).
        waiting = await load_approval(self.fleet.redis, self.fleet.keys, record.call_id)
        if waiting is not None and waiting.waiting:
            await expire(
                self.fleet.redis,
                self.fleet.keys,
                waiting,
                by="cancel",
                why="the task was cancelled",
            )
        await cancel_orphan(self.fleet, record)
        return {"resultType": "complete"}

    def _cancel_local(self, call_id: str) -> None:
        act = self._running.get(call_id)
        if act is not None and not act.done():
            self._cancelled.add(call_id)
            act.cancel()

    async def _listen_for_cancels(self) -> None:
        """Once per process: say it lives (its tasks stay its own), and cancel the act() of a
        task another replica was asked to cancel."""
        if self._listener is not None and not self._listener.done():
            return
        await self.store.beat(self.fleet.collector_id)
        pubsub = self.fleet.redis.pubsub()
        await pubsub.subscribe(self.store.cancel_channel())

        async def beat() -> None:
            while True:
                await asyncio.sleep(CREATOR_BEAT_S)
                with contextlib.suppress(redis.RedisError, OSError):
                    await self.store.beat(self.fleet.collector_id)

        async def listen() -> None:
            beating = asyncio.ensure_future(beat())
            try:
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._cancel_local(_text(message["data"]))
            finally:
                beating.cancel()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

        self._listener = asyncio.ensure_future(listen())

    async def aclose(self) -> None:
        """Stop: the calls of this process's tasks still running are cancelled (C9), as its
        synchronous calls are, and their tasks recorded cancelled, before the fleet closes."""
        for call_id in list(self._running):
            self._cancel_local(call_id)
        runners = [t for t in self._background if not t.done()]
        if runners:
            await asyncio.wait(runners, timeout=CANCEL_GRACE_S)
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(BaseException):
                await self._listener


def _header(ctx: Any, name: str) -> str | None:
    """The HTTP request's header ``name`` (the Authorization header binds a task to its
    creator), None over stdio or when absent."""
    request = getattr(ctx, "request", None)
    headers = getattr(request, "headers", None)
    value = headers.get(name) if headers is not None else None
    return str(value).strip() or None if value else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
