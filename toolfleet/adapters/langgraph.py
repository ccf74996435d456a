"""LangGraph on the fleet: ``FleetToolNode`` is a drop-in for ``langgraph.prebuilt.ToolNode``
whose tool calls run on toolfleet's workers.

``pip install "toolfleet[langgraph]"``, then::

    node = FleetToolNode(fleet=Fleet.from_env())   # the fleet's tools
    model = model.bind_tools(node.tools)           # the model sees toolfleet's specs
    builder.add_node("tools", node)                # where ToolNode(tools) was

- **Which tools.** ``tools`` lists fleet tools by name, as toolfleet ``Tool``s or ``@tool``
  functions (each becomes a LangChain ``StructuredTool`` with toolfleet's schema and
  description), or as LangChain tools (``BaseTool``, e.g. ``langchain_core.tools.tool`` over a
  toolfleet ``@tool`` function) whose names are fleet tools; None: every tool of the fleet.
  ``node.tools`` are the LangChain tools, for ``model.bind_tools``. Their local functions are
  never called by the node; a generated tool invoked on its own runs one call on the fleet.
- **One AIMessage, one batch.** The tool calls of the last ``AIMessage`` are one
  ``Branch.act`` batch; the node returns one ``ToolMessage`` per call, in the model's order,
  with its ``tool_call_id`` and ``name``. The state shapes are ToolNode's: a message list (a
  list back), a dict or an object with ``messages`` (``{"messages": [...]}`` back), a list of
  tool calls, or ``create_react_agent``'s per-call ``Send`` payloads (under ``ainvoke`` the
  calls of one superstep that arrive together are one batch too).
- **Failures are results.** A call that did not complete is ``ToolMessage(status="error")``
  with toolfleet's error text (``"ValueError: ..."``, a validation error naming the argument,
  a denial) as content, so the model can recover; ``handle_tool_errors`` may give a string or
  a ``callable(result) -> str`` instead, or ``False`` to raise ``ToolException`` after the
  batch (history written). A tool the node does not have is ToolNode's error message, never
  sent. Each message's ``response_metadata["toolfleet"]`` holds the call's id and status.
- **Conversations.** A run with a ``thread_id`` acts on the branch ``"langgraph:<thread_id>"``
  (``toolfleet history langgraph:<id>``): call ids derive from the model's tool-call ids in
  it, so a turn replayed in the thread (a resumed checkpoint) does not run its tools again
  (C7). Without a thread, each node run has a fresh branch. ``branch=`` puts every call on one
  branch; ``session=`` adds gates and observers; ``node.hooks`` holds TOOL_PRE / TOOL_POST /
  TOOL_ERROR handlers (``policy.pre_hook()`` of a ``PermissionPolicy``).
- **Cancellation.** Cancelling the task that awaits ``graph.ainvoke`` cancels the batch: queued
  calls revoked, running async ones cancelled on their workers, all recorded CANCELLED (C9).
  ``graph.invoke`` runs the batch with ``Branch.act_sync``.
- Not carried over from ToolNode: ``wrap_tool_call`` interceptors, injected arguments
  (``InjectedState``, ``ToolRuntime``: a worker gets JSON arguments only) and tools returning
  ``Command``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from toolfleet.schemas.errors import ConfigurationError

try:
    from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
    from langchain_core.runnables.config import RunnableConfig
    from langchain_core.tools import BaseTool, StructuredTool, ToolException
    from langgraph.prebuilt.tool_node import INVALID_TOOL_NAME_ERROR_TEMPLATE, ToolNode
    from langgraph.prebuilt.tool_node import msg_content_output as content_of
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"LangGraph is not installed ({exc}); pip install 'toolfleet[langgraph]'"
    ) from exc

from toolfleet.adapters._turns import Conversations, TurnBatcher, fleet_tool, run_blocking
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.hooks import HookBus
from toolfleet.dispatcher.govern.session import Session
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.errors import MalformedRequestError
from toolfleet.schemas.tool import Tool

__all__ = ["FleetToolNode"]

InputType = Literal["list", "dict", "tool_calls"]
ErrorHandling = bool | str | Callable[[ActionResponseModel], str]


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
        handle_tool_errors: ErrorHandling = True,
        messages_key: str = "messages",
    ) -> None:
        self.conversations = Conversations("langgraph", fleet=fleet, branch=branch, session=session)
        self.call_params = call_params
        self.batcher = TurnBatcher()
        registry = self.conversations.fleet.registry
        chosen: list[BaseTool] = []
        for item in list(registry) if tools is None else tools:
            if isinstance(item, BaseTool):
                fleet_tool(registry, item.name)  # the workers must know it by that name
                chosen.append(item)
            else:
                chosen.append(self._langchain_tool(fleet_tool(registry, item)))
        super().__init__(chosen, name=name, tags=tags, messages_key=messages_key)
        self._error_handling = handle_tool_errors
        self._key = messages_key

    @property
    def tools(self) -> list[BaseTool]:
        """The node's LangChain tools, for ``model.bind_tools``."""
        return list(self.tools_by_name.values())

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

    # --- ToolNode's two entry points: graph.invoke and graph.ainvoke --------------------

    def _func(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        *_: Any,  # ToolNode's runtime, unused (so the node runs outside a graph too)
    ) -> Any:
        calls, input_type = self._calls(input)
        sent = [c for c in calls if c["name"] in self.tools_by_name]
        results: list[ActionResponseModel] = []
        if sent:
            branch = self.conversations.branch_for(_thread(config))
            results = run_blocking(
                lambda: branch.act_sync([_envelope(c) for c in sent], call_params=self.call_params)
            )
        return self._answer(calls, results, input_type)

    async def _afunc(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        *_: Any,  # ToolNode's runtime, unused (so the node runs outside a graph too)
    ) -> Any:
        calls, input_type = self._calls(input)
        sent = [c for c in calls if c["name"] in self.tools_by_name]
        results: list[ActionResponseModel] = []
        if sent:
            thread = _thread(config)
            # Keyed by thread: create_react_agent's Send runs one node per call, and the
            # calls of one superstep arrive together. Without a thread, a batch of its own.
            key: Any = ("thread", thread) if thread else ("call", object())
            results = await self.batcher.submit(
                key,
                lambda: self.conversations.branch_for(thread),
                [_envelope(c) for c in sent],
                self.call_params,
            )
        return self._answer(calls, results, input_type)

    # --- shapes in and out -----------------------------------------------------------

    def _calls(self, input: Any) -> tuple[list[ToolCall], InputType]:
        """The tool calls to run and the shape to answer in (ToolNode's rules)."""
        if isinstance(input, list) and input and _is_tool_call(input[-1]):
            return list(input), "tool_calls"
        if isinstance(input, dict) and input.get("__type") == "tool_call_with_context":
            return [input["tool_call"]], "tool_calls"
        messages: Any
        if isinstance(input, list):
            messages, input_type = input, "list"
        elif isinstance(input, dict):
            messages, input_type = input.get(self._key) or [], "dict"
        else:
            messages, input_type = getattr(input, self._key, None) or [], "dict"
        if not messages:
            raise MalformedRequestError("No message found in input")
        ai = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        if ai is None:
            raise MalformedRequestError("No AIMessage found in input")
        return list(ai.tool_calls), input_type  # type: ignore[return-value]

    def _answer(
        self, calls: list[ToolCall], results: list[ActionResponseModel], input_type: InputType
    ) -> Any:
        answers = iter(results)
        messages: list[ToolMessage] = []
        failed: list[ActionResponseModel] = []
        for call in calls:
            if call["name"] not in self.tools_by_name:
                content = INVALID_TOOL_NAME_ERROR_TEMPLATE.format(
                    requested_tool=call["name"], available_tools=", ".join(self.tools_by_name)
                )
                messages.append(
                    ToolMessage(content, name=call["name"], tool_call_id=call["id"], status="error")
                )
                continue
            result = next(answers)
            if result.error is not None:
                failed.append(result)
            messages.append(self._message(call, result))
        if failed and self._error_handling is False:
            first = failed[0]
            raise ToolException(f"tool {first.function!r} failed: {first.error}")
        return messages if input_type == "list" else {self._key: messages}

    def _message(self, call: ToolCall, result: ActionResponseModel) -> ToolMessage:
        meta = {"toolfleet": {"call_id": result.call_id, "status": result.status.value}}
        tool_call_id = call["id"] or result.tool_call_id or ""
        if result.error is None:
            return ToolMessage(
                content=content_of(result.output),  # type: ignore[arg-type]
                name=call["name"],
                tool_call_id=tool_call_id,
                response_metadata=meta,
            )
        handling = self._error_handling
        if isinstance(handling, str):
            content = handling
        elif callable(handling):
            content = handling(result)
        else:
            content = result.error
        return ToolMessage(
            content=content,
            name=call["name"],
            tool_call_id=tool_call_id,
            status="error",
            response_metadata=meta,
        )

    def _langchain_tool(self, tool: Tool) -> BaseTool:
        """A LangChain tool with toolfleet's spec that runs one call on the fleet."""
        [spec] = self.conversations.fleet.registry.specs("openai", names=[tool.function])
        function = spec["function"]
        name = tool.function

        def run(**arguments: Any) -> Any:
            branch = self.conversations.branch_for(None)
            call = {"function": name, "arguments": arguments}
            [result] = run_blocking(lambda: branch.act_sync([call], call_params=self.call_params))
            return _output(result)

        async def arun(**arguments: Any) -> Any:
            branch = self.conversations.branch_for(None)
            call = {"function": name, "arguments": arguments}
            [result] = await branch.act([call], call_params=self.call_params)
            return _output(result)

        return StructuredTool(
            name=name,
            description=function.get("description") or f"Run the tool {name}.",
            args_schema=dict(function.get("parameters") or {"type": "object"}),
            func=run,
            coroutine=arun,
        )


def _output(result: ActionResponseModel) -> Any:
    if result.error is not None:
        raise ToolException(result.error)
    return result.output


def _envelope(call: ToolCall) -> dict[str, Any]:
    envelope: dict[str, Any] = {"function": call["name"], "arguments": call.get("args") or {}}
    if call.get("id"):
        envelope["id"] = call["id"]
    return envelope


def _is_tool_call(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "tool_call"


def _thread(config: RunnableConfig | None) -> str | None:
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    return str(thread) if thread not in (None, "") else None
