"""The calls of ``FleetToolNode`` (toolfleet.adapters.langgraph) on the fleet: the stand-in
LangChain tool whose function is a call on the fleet, the call's envelope (the model's
arguments and the values LangGraph injected), a result turned back into what the local
function would have returned or raised, and the gathering of a node run's calls into one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple, get_origin

from langchain_core.messages import ToolCall
from langchain_core.runnables.config import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.prebuilt import InjectedStore, ToolRuntime
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from toolfleet.dispatcher.batch.units import DENIED_OUTPUT_ERROR
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.error_info import rebuild_error
from toolfleet.schemas.errors import ConfigurationError, ToolfleetError
from toolfleet.schemas.progress import CallProgress
from toolfleet.schemas.tool import Tool
from toolfleet.workers.graph_context import CUSTOM_STREAM_KEY
from toolfleet.workers.specs import tool_description

__all__ = [
    "CALL",
    "GATHER_S",
    "RUN",
    "ArgumentKeys",
    "FleetCall",
    "LiveInjectionError",
    "NoJSONOutputError",
    "NodeRun",
    "OutsideTheGraphError",
    "argument_keys",
    "envelope",
    "exception",
    "langchain_tool",
    "refuse_live_injections",
]

# The tool call a stand-in is invoked for (its id keys the call on the branch, C7).
CALL: ContextVar[ToolCall | None] = ContextVar("toolfleet_langgraph_call", default=None)
# How long a call waits for the other calls of its node run, to be sent with them.
GATHER_S = 0.5

# One node run: its calls without a thread are one batch; its results by tool-call id.
RUN: ContextVar[NodeRun | None] = ContextVar("toolfleet_langgraph_run", default=None)


class NodeRun:
    """One node run: its calls' results by tool-call id, and the gathering of its calls into
    one batch. ToolNode starts every call at once, but each reaches the fleet only after
    LangChain's validation and callbacks, some loop ticks later; so a call waits until every
    call of the run is sent or finished (refused by validation, short-circuited by an
    interceptor), at most :data:`GATHER_S`, and then all are submitted in the same tick.
    Under ``graph.invoke`` (ToolNode's threads) the same: the last call to come, or the first
    whose wait ends, sends those gathered as one ``act_sync`` (:meth:`send_together`)."""

    def __init__(
        self, call_ids: Sequence[str], writer: Callable[[Any], None] | None = None
    ) -> None:
        self.results: dict[str, ActionResponseModel] = {}
        # Each call's place in the model's message: a batch is sent in the model's order,
        # whichever call reached the fleet first (calls arrive as their tasks get turns).
        self._places = {call_id: place for place, call_id in enumerate(call_ids)}
        # The graph's stream writer (None outside a graph): the calls' writes on the workers
        # come as progress reports (toolfleet.workers.graph_context) and go on to it.
        self.writer = writer
        self.sending: set[asyncio.Task[Any]] = set()
        self._unsettled = set(call_ids)
        self._ready = asyncio.Event()
        if not self._unsettled:
            self._ready.set()
        self._changed = threading.Condition()
        self._gathered: list[_Slot] = []

    def position(self, call: ToolCall | None) -> int | None:
        """The place of ``call`` in the model's message (None: not one of this run's)."""
        call_id = call.get("id") if call is not None else None
        return self._places.get(str(call_id)) if call_id else None

    def settle(self, call_id: str) -> None:
        """``call_id`` is sent, or done without being sent."""
        with self._changed:
            self._unsettled.discard(call_id)
            if not self._unsettled:
                self._ready.set()
            self._changed.notify_all()

    def send_together(
        self,
        call_id: str,
        envelope: dict[str, Any],
        act: Callable[[list[dict[str, Any]]], list[ActionResponseModel]],
    ) -> ActionResponseModel:
        """``envelope``'s result, sent by ``act`` with the other calls of the run that are
        here (threads): one of them sends them all, the others wait for it."""
        slot = _Slot(envelope)
        deadline = time.monotonic() + GATHER_S
        with self._changed:
            self._gathered.append(slot)
            self._unsettled.discard(call_id)
            self._changed.notify_all()
            while self._unsettled and not slot.taken:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            leader = not slot.taken
            batch = [s for s in self._gathered if not s.taken] if leader else []
            batch.sort(key=lambda s: self._places.get(str(s.envelope.get("id")), len(self._places)))
            for gathered in batch:
                gathered.taken = True
            self._gathered = [s for s in self._gathered if not s.taken]
            self._changed.notify_all()
        if leader:
            try:
                results = act([s.envelope for s in batch])
                for gathered, result in zip(batch, results, strict=True):
                    gathered.result = result
            except BaseException as exc:
                for gathered in batch:
                    gathered.error = exc
                raise
            finally:
                for gathered in batch:
                    gathered.done.set()
        # Bounded: the leader sets it once its act_sync returns or raises.
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        return slot.result

    def stream(self, report: CallProgress) -> None:
        """A progress report: a write to LangGraph's custom stream goes on to the graph's
        writer; any other report (the tool's own ``progress()``) is not the graph's."""
        if self.writer is None or not report.message:
            return
        try:
            sent = json.loads(report.message)
        except ValueError:
            return
        if isinstance(sent, dict) and CUSTOM_STREAM_KEY in sent:
            self.writer(sent[CUSTOM_STREAM_KEY])

    @property
    def on_progress(self) -> Callable[[CallProgress], None] | None:
        """What act() is given: a progress callback when there is a stream to write to."""
        return self.stream if self.writer is not None else None

    async def wind_down(self) -> None:
        """Wait for the run's calls on the fleet to end, once they are cancelled."""
        pending = {t for t in self.sending if not t.done()}
        while pending:
            with contextlib.suppress(asyncio.CancelledError):
                # Bounded: each was cancelled, and a batch's cancellation is (C9).
                await asyncio.wait(pending)
            pending = {t for t in pending if not t.done()}

    async def gathered(self, call_id: str) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.sending.add(task)
        self.settle(call_id)
        with contextlib.suppress(TimeoutError):
            # Bounded: an interceptor may hold its call back for good (or until another
            # call's result), and the calls already here must not wait for it.
            async with asyncio.timeout(GATHER_S):
                await self._ready.wait()


class _Slot:
    """One call waiting in :meth:`NodeRun.send_together`."""

    def __init__(self, envelope: dict[str, Any]) -> None:
        self.envelope = envelope
        self.taken = False
        self.done = threading.Event()
        self.result: ActionResponseModel | None = None
        self.error: BaseException | None = None


class FleetCall(StructuredTool):
    """A node's stand-in for one tool: LangChain's invoke around a call on the fleet."""

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        token = CALL.set(input if _is_tool_call(input) else None)
        try:
            return super().invoke(input, config, **kwargs)
        finally:
            CALL.reset(token)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        token = CALL.set(input if _is_tool_call(input) else None)
        try:
            return await super().ainvoke(input, config, **kwargs)
        finally:
            CALL.reset(token)


class OutsideTheGraphError(ToolfleetError):
    """Raised when a tool on a worker calls a LangGraph function that needs a part of the
    graph's run a worker does not have (a worker gives a tool a stream writer, ``interrupt()``
    and a config: nothing else of the run)."""


class NoJSONOutputError(ToolfleetError):
    """Raised when a tool on a worker returned a value with no JSON form, so nothing of it
    could come back (a live object; a ``Command`` whose ``goto`` holds a ``Send``)."""


def _outside_the_run(kind: str, message: str) -> bool:
    """LangGraph's error for a run-time function called with no graph run, or with a part of
    the run a worker does not give a tool (toolfleet.workers.graph_context)."""
    if kind == "RuntimeError":
        return "outside of a runnable context" in message
    return kind == "KeyError" and "__pregel_" in message


def exception(result: ActionResponseModel) -> BaseException:
    """The exception of a call that did not complete, as the tool raised it: its type
    rebuilt on this side when importable here (else a RemoteToolError naming it,
    :func:`toolfleet.schemas.rebuild_error`); a call a gate refused is a PermissionError."""
    info = result.error_info
    if info is not None and _outside_the_run(info.type, info.message):
        return OutsideTheGraphError(
            f"tool {result.function!r} called a LangGraph function that needs a part of the "
            f"graph's run a worker does not have ({info.type}: {info.message}); a worker has "
            "a stream writer, interrupt() and a config only: keep this tool in a ToolNode"
        )
    if info is not None:
        return rebuild_error(info)
    text = result.error or ""
    if text == DENIED_OUTPUT_ERROR:
        return PermissionError(text)
    return ToolException(text)


def envelope(name: str, keys: ArgumentKeys, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call to enqueue: the model's (validated) arguments, as JSON, and the values the
    framework injected — ToolNode has already dropped any the model sent for them. Any other
    key (a schema given as a dict passes the model's keys unchecked) is dropped too."""
    arguments: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in keys.model:
            arguments[key] = to_jsonable_python(value, fallback=str)
            continue
        if key not in keys.injected:
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"tool {name!r}: the value LangGraph injects for parameter {key!r} is a "
                f"{type(value).__name__}, not JSON, so it cannot reach a worker; inject a "
                "state field of JSON values (strings, numbers, lists, dicts)"
            ) from None
        arguments[key] = value
    envelope: dict[str, Any] = {"function": name, "arguments": arguments}
    call = CALL.get()
    if call is not None and call.get("id"):
        envelope["id"] = call["id"]
    return envelope


def langchain_tool(tool: Tool) -> BaseTool:
    """A LangChain tool over a toolfleet function: LangChain's schema of its signature (the
    injected parameters hidden from the model), toolfleet's description."""
    function = tool.func_callable
    is_async = tool.kind == "async"
    return StructuredTool.from_function(
        func=None if is_async else function,
        coroutine=function if is_async else None,
        name=tool.function,
        description=tool_description(tool),
        args_schema=tool.request_options,
    )


class ArgumentKeys(NamedTuple):
    """A tool's arguments by who sets them."""

    model: frozenset[str]  # in the schema the model is shown
    injected: frozenset[str]  # in the tool's schema, hidden from the model: LangGraph's


def argument_keys(tool: BaseTool, fleet: Tool) -> ArgumentKeys:
    """``tool``'s arguments by who sets them. ConfigurationError when ``tool`` shows the model
    a parameter that the fleet's function (``fleet``) declares injected."""
    model = _fields(tool.tool_call_schema)
    shown = model & fleet.injected_args
    if shown:
        raise ConfigurationError(
            f"tool {tool.name!r} shows the model the parameters {sorted(shown)}, which "
            f"{fleet.function!r} declares injected by the framework; annotate them as injected "
            "(InjectedState, InjectedToolArg, ...) in the tool's schema too"
        )
    schema = tool.args_schema if tool.args_schema is not None else tool.get_input_schema()
    return ArgumentKeys(model, _fields(schema) - model)


def _fields(schema: Any) -> frozenset[str]:
    if isinstance(schema, dict):
        return frozenset(schema.get("properties") or {})
    fields = getattr(schema, "model_fields", None) or getattr(schema, "__fields__", {})
    return frozenset(fields)


class LiveInjectionError(ConfigurationError):
    """Raised when a tool given to FleetToolNode takes a live object LangGraph injects."""


def refuse_live_injections(tool: BaseTool, model_keys: frozenset[str]) -> None:
    """ConfigurationError for a parameter that would get a live object (a store, the runtime)."""
    schema = tool.args_schema if isinstance(tool.args_schema, type) else tool.get_input_schema()
    if not issubclass(schema, BaseModel):
        return
    for key, field in schema.model_fields.items():
        if key in model_keys:
            continue
        marks = [field.annotation, *field.metadata]
        if any(_is(mark, InjectedStore) for mark in marks):
            what = "InjectedStore (a live store)"
        elif any(_is(mark, ToolRuntime) for mark in marks):
            what = "ToolRuntime (live objects)"
        else:
            continue
        raise LiveInjectionError(
            f"tool {tool.name!r}: parameter {key!r} is {what}, which cannot reach a worker; "
            "inject JSON state with InjectedState(...) instead, or keep this tool in a ToolNode"
        )


def _is(mark: Any, kind: type) -> bool:
    if isinstance(mark, kind):
        return True
    cls = mark if isinstance(mark, type) else get_origin(mark)
    return isinstance(cls, type) and issubclass(cls, kind)


def _is_tool_call(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "tool_call"
