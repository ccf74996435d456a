"""LangGraph on the fleet: ``FleetToolNode`` is a drop-in for ``langgraph.prebuilt.ToolNode``
whose tool calls run on toolfleet's workers.

``pip install "toolfleet[langgraph]"``, then::

    node = FleetToolNode(fleet=Fleet.from_env())   # the fleet's tools
    model = model.bind_tools(node.tools)           # the model sees the tools' specs
    builder.add_node("tools", node)                # where ToolNode(tools) was

- **It is ToolNode.** The node is a ``ToolNode`` (same arguments: ``handle_tool_errors``,
  ``wrap_tool_call``, ``awrap_tool_call``, ``messages_key``) whose tools are stand-ins: each runs
  LangChain's own ``invoke`` of the tool (argument validation, ``InjectedToolCallId``, the
  tool's own ``handle_tool_error``, the ``ToolMessage``) around one call on the fleet instead of
  the local function. So parsing, injection, interceptors, error handling, error texts
  (``TOOL_CALL_ERROR_TEMPLATE``, ...) and the messages are ToolNode's: a graph's history
  compares equal to the one ToolNode gives. A tool's exception comes back as its own type
  (rebuilt on this side when importable), so ``handle_tool_errors=(ValueError,)`` or a handler
  typed for one exception handles exactly what it would locally.
- **Which tools.** ``tools`` lists fleet tools by name, as toolfleet ``Tool``s or ``@tool``
  functions (each becomes a LangChain tool with LangChain's schema of the function and
  toolfleet's description), or as LangChain tools (``BaseTool``) whose names are fleet tools;
  None: every tool of the fleet. ``node.tools`` are the LangChain tools, for
  ``model.bind_tools``; their local functions are never called by the node. A generated tool
  invoked on its own runs one call on the fleet.
- **Nothing hidden leaves the agent.** A parameter the framework injects
  (``Annotated[..., InjectedToolArg]`` and subclasses, ``InjectedState``,
  ``InjectedToolCallId``) is not in the spec the model sees (nor in toolfleet's spec of the
  function), a value the model sends for it is dropped before anything is enqueued (ToolNode's
  rule), and the framework's value is sent instead, kept out of records, history and Flower
  like a secret argument. Such a value must be JSON (a state field of strings, numbers, ...):
  one that is not is refused at the call, naming the tool and the parameter. A tool taking
  ``InjectedStore`` or ``ToolRuntime`` (live objects) is refused when the node is built
  (``LiveInjectionError``; with ``tools=None`` it is left out, with a warning).
- **Returns.** A tool may return a ``Command`` (update, ``goto`` a node) or a list of
  ``Command``s and ``ToolMessage``s: they travel as JSON and are rebuilt here
  (``langgraph_wire``). A result with no JSON form is ``NoJSONOutputError``.
  ``interrupt()`` in a tool on a worker pauses the graph as under ToolNode (same
  ``__interrupt__``; a checkpointer and a thread, as LangGraph needs), and
  ``Command(resume=...)`` (a JSON value) reaches the worker, where the tool runs again from
  its start (``langgraph_interrupt``). ``get_stream_writer()``
  writes on a worker reach the graph's ``custom`` stream as the call's progress reports (at
  most 10 a second, the latest kept).
- **Batches.** The calls of one AIMessage are one batch: each waits until every call of the
  node run is sent or done (at most ``GATHER_S``), then they go as one ``Branch.act`` (under
  ``graph.ainvoke``; with ``create_react_agent``'s per-call ``Send``, the calls of one
  superstep of a thread) or one ``act_sync`` (under ``graph.invoke``, from ToolNode's threads).
- **Conversations.** A run with a ``thread_id`` acts on the branch ``"langgraph:<thread_id>"``
  (``toolfleet history langgraph:<id>``): call ids derive from the model's tool-call ids in
  it, so a turn replayed in the thread (a resumed checkpoint) does not run its tools again
  (C7). Without a thread, each call has a fresh branch. ``branch=`` puts every call on one
  branch; ``session=`` adds gates and observers; ``node.hooks`` holds TOOL_PRE / TOOL_POST /
  TOOL_ERROR handlers (``policy.pre_hook()`` of a ``PermissionPolicy``). A call a gate or
  policy refuses fails like a tool raising ``PermissionError``.
- **toolfleet's ids stay in toolfleet's history** (``toolfleet history``), not in the
  messages; ``toolfleet_metadata=True`` adds ``response_metadata["toolfleet"]`` (call id,
  status) to each ToolMessage, at the cost of equality with ToolNode's messages.
- **Cancellation.** Cancelling the task that awaits ``graph.ainvoke`` cancels the batch: queued
  calls revoked, running async ones cancelled on their workers, all recorded CANCELLED (C9).

What cannot cross to a worker, and what the node does instead: docs/agent-ecosystem.md.
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from toolfleet.schemas.errors import ConfigurationError

try:
    from langchain_core.messages import ToolCall, ToolMessage
    from langchain_core.runnables.config import RunnableConfig
    from langchain_core.tools import BaseTool
    from langgraph.prebuilt.tool_node import ToolNode
    from langgraph.runtime import Runtime
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"LangGraph is not installed ({exc}); pip install 'toolfleet[langgraph]'"
    ) from exc

from toolfleet.adapters._turns import Conversations, TurnBatcher, fleet_tool, run_blocking
from toolfleet.adapters.langgraph_calls import (
    CALL,
    RUN,
    FleetCall,
    LiveInjectionError,
    NodeRun,
    NoJSONOutputError,
    argument_keys,
    envelope,
    exception,
    langchain_tool,
    refuse_live_injections,
)
from toolfleet.adapters.langgraph_interrupt import resumed, resumed_async
from toolfleet.adapters.langgraph_wire import graph_output
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.hooks import HookBus
from toolfleet.dispatcher.session import Session
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.serialize import UNSERIALIZABLE
from toolfleet.schemas.tool import Tool

try:  # where Pregel keeps a run's Runtime in the config; absent outside a graph
    from langgraph._internal._constants import CONFIG_KEY_RUNTIME
except ImportError:  # pragma: no cover - older langgraph
    CONFIG_KEY_RUNTIME = "__pregel_runtime"

__all__ = ["FleetToolNode"]

ErrorHandling = bool | str | Callable[..., str] | type[Exception] | tuple[type[Exception], ...]
# ToolNode's own default: a ToolInvocationError (bad arguments) becomes an error message,
# any other exception is raised.
TOOLNODE_DEFAULT: Any = (
    inspect.signature(ToolNode.__init__).parameters["handle_tool_errors"].default
)


class FleetToolNode(ToolNode):
    """``ToolNode`` whose calls run on the fleet, one ``Branch.act`` batch per AIMessage."""

    def __init__(
        self,
        tools: Sequence[BaseTool | str | Tool | Callable[..., Any]] | None = None,
        *,
        fleet: Fleet | None = None,
        branch: Branch | None = None,
        session: Session | None = None,
        call_params: CallParams | None = None,
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: ErrorHandling = TOOLNODE_DEFAULT,
        messages_key: str = "messages",
        wrap_tool_call: Any = None,
        awrap_tool_call: Any = None,
        toolfleet_metadata: bool = False,
    ) -> None:
        self.conversations = Conversations("langgraph", fleet=fleet, branch=branch, session=session)
        self.call_params = call_params
        self.toolfleet_metadata = toolfleet_metadata
        self.batcher = TurnBatcher()
        registry = self.conversations.fleet.registry
        self._shown: list[BaseTool] = []
        stand_ins: list[BaseTool] = []
        for item in list(registry) if tools is None else tools:
            try:
                if isinstance(item, BaseTool):
                    # The workers must know it by that name.
                    stand_in = self._stand_in(item, fleet_tool(registry, item.name))
                    self._shown.append(item)
                else:
                    known = fleet_tool(registry, item)
                    stand_in = self._stand_in(langchain_tool(known), known)
                    self._shown.append(stand_in)
            except LiveInjectionError as exc:
                if tools is not None:
                    raise
                # "Every tool of the fleet": those that can run on it, the others named.
                warnings.warn(f"{exc}; left out of the node", stacklevel=2)
                continue
            stand_ins.append(stand_in)
        super().__init__(
            stand_ins,
            name=name,
            tags=tags,
            handle_tool_errors=handle_tool_errors,
            messages_key=messages_key,
            wrap_tool_call=wrap_tool_call,
            awrap_tool_call=awrap_tool_call,
        )

    @property
    def tools(self) -> list[BaseTool]:
        """The node's LangChain tools, for ``model.bind_tools``."""
        return list(self._shown)

    @property
    def hooks(self) -> HookBus:
        """TOOL_PRE / TOOL_POST / TOOL_ERROR handlers of every call (the ``branch=``'s own)."""
        return self.conversations.hooks

    @property
    def fleet(self) -> Fleet:
        return self.conversations.fleet

    def branch_id(self, thread_id: str | None) -> str | None:
        """The toolfleet branch (history) of a LangGraph thread."""
        return self.conversations.branch_id(thread_id)

    # --- ToolNode's two entry points, with the run's scope around them ------------------

    def _func(self, input: Any, config: RunnableConfig, *_: Any) -> Any:
        runtime = _runtime(config)
        with self._run_scope(input, runtime) as run:
            return self._labelled(super()._func(input, config, runtime), run)

    async def _afunc(self, input: Any, config: RunnableConfig, *_: Any) -> Any:
        runtime = _runtime(config)
        with self._run_scope(input, runtime) as run:
            try:
                output = await super()._afunc(input, config, runtime)
            except asyncio.CancelledError:
                # ToolNode's gather ends at the first cancelled call; the others are being
                # cancelled too, and the last one out cancels the batch, which records its
                # calls CANCELLED (C9): that is over before the cancellation goes on.
                await run.wind_down()
                raise
            return self._labelled(output, run)

    def _run_one(self, call: ToolCall, *args: Any) -> Any:
        try:
            return super()._run_one(call, *args)
        finally:
            run = RUN.get()
            if run is not None and call.get("id"):
                run.settle(str(call["id"]))

    async def _arun_one(self, call: ToolCall, *args: Any) -> Any:
        try:
            return await super()._arun_one(call, *args)
        finally:
            run = RUN.get()
            if run is not None and call.get("id"):
                run.settle(str(call["id"]))

    @contextmanager
    def _run_scope(self, input: Any, runtime: Runtime[Any]) -> Iterator[NodeRun]:
        calls, _ = self._parse_input(input)
        writer = None if runtime.stream_writer is _NO_STREAM else runtime.stream_writer
        run = NodeRun(
            [str(c["id"]) for c in calls if c.get("id") and c["name"] in self.tools_by_name],
            writer,
        )
        token = RUN.set(run)
        try:
            yield run
        finally:
            RUN.reset(token)

    def _labelled(self, output: Any, run: NodeRun) -> Any:
        """``output`` with toolfleet's call id and status on each ToolMessage, if asked."""
        if self.toolfleet_metadata:
            for message in _messages(output):
                result = run.results.get(message.tool_call_id)
                if result is not None:
                    message.response_metadata["toolfleet"] = {
                        "call_id": result.call_id,
                        "status": result.status.value,
                    }
        return output

    # --- one call on the fleet ---------------------------------------------------------

    def _stand_in(self, tool: BaseTool, fleet: Tool) -> FleetCall:
        """``tool`` as LangChain runs it, its function replaced by a call on the fleet's
        function ``fleet``."""
        name = tool.name
        keys = argument_keys(tool, fleet)
        refuse_live_injections(tool, keys.model)

        def run(config: RunnableConfig, **kwargs: Any) -> Any:
            sent = envelope(name, keys, kwargs)
            node_run, call = RUN.get(), CALL.get()
            progress = node_run.on_progress if node_run is not None else None

            def act(calls: list[dict[str, Any]]) -> list[ActionResponseModel]:
                branch = self.conversations.branch_for(_thread(config))
                self.batcher.batch_sizes.append(len(calls))  # the record of batches sent
                params = self.call_params
                return run_blocking(
                    lambda: branch.act_sync(calls, call_params=params, on_progress=progress)
                )

            if node_run is not None and call is not None and call.get("id"):
                result = node_run.send_together(str(call["id"]), sent, act)
            else:
                [result] = act([sent])
            result = resumed(name, sent, result, lambda again: act([again])[0])
            return self._outcome(tool, result)

        async def arun(config: RunnableConfig, **kwargs: Any) -> Any:
            sent = envelope(name, keys, kwargs)
            run, call = RUN.get(), CALL.get()
            if run is not None and call is not None and call.get("id"):
                await run.gathered(str(call["id"]))
            thread = _thread(config)
            # Keyed by thread: create_react_agent's Send runs one node per call, and the
            # calls of one superstep arrive together. Without a thread, by node run.
            key: Any = ("thread", thread) if thread else ("run", RUN.get() or object())
            progress = run.on_progress if run is not None else None

            def branch_for() -> Branch:
                return self.conversations.branch_for(thread)

            [result] = await self.batcher.submit(
                key,
                branch_for,
                [sent],
                self.call_params,
                progress,
                order=run.position(call) if run is not None else None,
            )

            async def again(resent: dict[str, Any]) -> ActionResponseModel:
                [answer] = await self.batcher.submit(
                    key, branch_for, [resent], self.call_params, progress
                )
                return answer

            result = await resumed_async(name, sent, result, again)
            return self._outcome(tool, result)

        return FleetCall(
            name=name,
            description=tool.description,
            args_schema=tool.args_schema or tool.get_input_schema(),
            func=run,
            coroutine=arun,
            return_direct=tool.return_direct,
            response_format=tool.response_format,
            handle_tool_error=tool.handle_tool_error,
            handle_validation_error=tool.handle_validation_error,
            tags=tool.tags,
            metadata=tool.metadata,
            callbacks=tool.callbacks,
            verbose=tool.verbose,
            extras=tool.extras,
        )

    def _outcome(self, tool: BaseTool, result: ActionResponseModel) -> Any:
        """What the local function would have returned, or the exception it would have raised."""
        run = RUN.get()
        call = CALL.get()
        if run is not None and call is not None and call.get("id"):
            run.results[str(call["id"])] = result
        if result.error is not None:
            raise exception(result)
        if result.output == UNSERIALIZABLE:
            raise NoJSONOutputError(
                f"tool {tool.name!r} returned a value with no JSON form (a live object, or a "
                "Command whose goto holds a Send), so it cannot come back from a worker; "
                "return JSON, messages or a Command with node names"
            )
        output = graph_output(result.output)
        if tool.response_format == "content_and_artifact" and isinstance(output, list):
            return tuple(output)  # a (content, artifact) pair travels as a JSON list
        return output


def _messages(output: Any) -> Iterator[ToolMessage]:
    items = output if isinstance(output, list) else [output]
    for item in items:
        if isinstance(item, ToolMessage):
            yield item
        elif isinstance(item, dict):
            yield from _messages(next(iter(item.values())) if len(item) == 1 else [])
        elif isinstance(item, list):
            yield from _messages(item)


# The stream writer of a Runtime made outside a graph: writes go nowhere.
_NO_STREAM = Runtime().stream_writer


def _runtime(config: RunnableConfig) -> Runtime[Any]:
    """The graph run's Runtime; outside a graph, an empty one (the node runs there too)."""
    runtime = (config.get("configurable") or {}).get(CONFIG_KEY_RUNTIME)
    return runtime if isinstance(runtime, Runtime) else Runtime()


def _thread(config: RunnableConfig | None) -> str | None:
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    return str(thread) if thread not in (None, "") else None
