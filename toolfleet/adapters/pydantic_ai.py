"""Pydantic AI on the fleet: ``FleetToolset`` is a Pydantic AI toolset whose tools are the
fleet's and whose calls run on toolfleet's workers.

``pip install "toolfleet[pydantic-ai]"``, then::

    agent = Agent(model, toolsets=[FleetToolset(fleet=Fleet.from_env())])

- **One turn, one batch.** Pydantic AI runs a turn's parallel calls as one task each, and each
  reaches ``call_tool``; the calls that arrive together (the same few event-loop ticks, the same
  run) are sent as one ``Branch.act`` batch (``toolfleet.adapters._turns.TurnBatcher``), in the
  model's order, each call under the model's ``tool_call_id``.
- **Specs and arguments.** The tools' definitions are toolfleet's specs (the registry's schema
  and description). Arguments are checked against the tool's argument model before anything is
  sent, as the dispatcher and the worker will check them: a mismatch is Pydantic AI's retry
  prompt, as for a local tool's ``ValidationError``.
- **Retries keep their meaning.** A tool that raises ``pydantic_ai.ModelRetry`` on the worker
  fails there with the error ``"ModelRetry: <message>"``; the toolset raises ``ModelRetry``
  with that message here, so the model is asked again (counted against the tool's retries).
  ``ToolFailed`` likewise; a worker-side timeout (``ToolTimeoutError``) is a ``ModelRetry``, as
  a local tool's timeout is. The error's type name is the whole test, so any exception class
  named ``ModelRetry`` counts.
- **Other failures are results.** A tool that raised, a call denied by a gate or stopped by a
  TOOL_PRE guard is ``ToolFailed`` with toolfleet's error text: the model sees it and adapts
  (toolfleet's rule, C1). ``raise_failures=True`` raises ``ToolfleetToolError`` instead, ending
  the run as a local tool's exception would.
- **Conversations.** The calls of a run act on the branch ``"pydantic-ai:<conversation_id>"``
  (``toolfleet history pydantic-ai:<id>``); call ids derive from the model's tool-call ids in
  it, so replaying a turn does not run its tools again (C7). ``branch=`` puts every call on one
  branch; ``session=`` adds gates and observers; :attr:`FleetToolset.hooks` holds TOOL_PRE /
  TOOL_POST / TOOL_ERROR handlers (``policy.pre_hook()`` of a ``PermissionPolicy``).
- **Cancellation.** Cancelling the run cancels the turn's tasks, and with them the batch: queued
  calls are revoked, running async ones cancelled on their workers, all recorded CANCELLED (C9).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool

from toolfleet.adapters._turns import Conversations, TurnBatcher, fleet_tool
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.hooks import HookBus
from toolfleet.dispatcher.govern.session import Session
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.errors import ArgumentValidationError, ToolfleetError
from toolfleet.schemas.function_calling import normalize_arguments
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tool import Tool

__all__ = ["FleetToolset", "ToolfleetToolError", "answer"]

# Error types (ErrorInfo.type) and what the model is told.
_RETRY = ("ModelRetry", "ArgumentValidationError", "ToolTimeoutError")
_FAILED = "ToolFailed"


class ToolfleetToolError(ToolfleetError, RuntimeError):
    """A fleet call that did not complete, raised with ``raise_failures=True``."""

    def __init__(self, result: ActionResponseModel) -> None:
        super().__init__(f"tool {result.function!r} ({result.status.value}): {result.error}")
        self.result = result


class FleetToolset(AbstractToolset[Any]):
    """A Pydantic AI toolset of fleet tools, run on toolfleet's workers.

    ``tools``: names of registered toolfleet tools, toolfleet ``Tool``s or ``@tool``
    functions; None for every tool of the fleet's registry. ``fleet``: default the branch's,
    the session's, else ``Fleet.from_env()``. ``max_retries``: per tool, None for the agent's.
    ``call_params``: toolfleet's batch controls (timeout, retries on the fleet, window).
    """

    def __init__(
        self,
        tools: Sequence[str | Tool | Any] | None = None,
        *,
        fleet: Fleet | None = None,
        branch: Branch | None = None,
        session: Session | None = None,
        max_retries: int | None = None,
        call_params: CallParams | None = None,
        raise_failures: bool = False,
        id: str | None = None,
    ) -> None:
        self.conversations = Conversations(
            "pydantic-ai", fleet=fleet, branch=branch, session=session
        )
        registry = self.conversations.fleet.registry
        chosen = list(registry) if tools is None else [fleet_tool(registry, t) for t in tools]
        self._tools: dict[str, Tool] = {t.function: t for t in chosen}
        specs = registry.specs("openai", names=list(self._tools))
        self._definitions = {
            s["function"]["name"]: ToolDefinition(
                name=s["function"]["name"],
                description=s["function"].get("description"),
                parameters_json_schema=dict(s["function"].get("parameters") or {}),
                metadata={"toolfleet": True},
            )
            for s in specs
        }
        self.max_retries = max_retries
        self.call_params = call_params
        self.raise_failures = raise_failures
        self.batcher = TurnBatcher()
        self._id = id

    @property
    def id(self) -> str | None:
        return self._id

    @property
    def hooks(self) -> HookBus:
        """TOOL_PRE / TOOL_POST / TOOL_ERROR handlers of every call (the ``branch=``'s own)."""
        return self.conversations.hooks

    @property
    def fleet(self) -> Fleet:
        return self.conversations.fleet

    def branch_id(self, conversation_id: str | None) -> str | None:
        """The toolfleet branch (history) of a Pydantic AI conversation."""
        return self.conversations.branch_id(conversation_id)

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        max_retries = self.max_retries if self.max_retries is not None else ctx.max_retries
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=max_retries,
                args_validator=_ArgumentsCheck(self._tools[name]),
            )
            for name, definition in self._definitions.items()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        conversation = ctx.conversation_id
        envelope: dict[str, Any] = {"function": name, "arguments": tool_args}
        if ctx.tool_call_id:
            envelope["id"] = ctx.tool_call_id
        # One batch per run's turn: the run's calls that arrive together.
        key = (
            ("run", ctx.run_id) if ctx.run_id else ("conversation", conversation, id(ctx.messages))
        )
        [result] = await self.batcher.submit(
            key,
            lambda: self.conversations.branch_for(conversation),
            [envelope],
            self.call_params,
        )
        return answer(result, raise_failures=self.raise_failures)


def answer(result: ActionResponseModel, *, raise_failures: bool = False) -> Any:
    """A fleet result as Pydantic AI expects a tool's outcome: the output, or the exception
    the tool raised where Pydantic AI gives it meaning (``ModelRetry``, ``ToolFailed``)."""
    if result.status is EventStatus.COMPLETED and result.error is None:
        return result.output
    error = result.error or f"the call ended {result.status.value}"
    info = result.error_info  # the error as structure: its class, never parsed from the text
    kind, message = (info.type, info.message) if info is not None else ("", error)
    if kind in _RETRY:
        raise ModelRetry(message if kind == "ModelRetry" else error)
    if kind == _FAILED:
        raise ToolFailed(message)
    if raise_failures:
        raise ToolfleetToolError(result)
    raise ToolFailed(error)


class _ArgumentsCheck:
    """The tool's argument check, as a Pydantic AI argument validator: the model's arguments,
    unchanged, when toolfleet would accept them; else ``ModelRetry`` saying why."""

    def __init__(self, tool: Tool) -> None:
        self.tool = tool

    def validate_json(
        self,
        input: str | bytes | bytearray,
        *,
        allow_partial: bool | Literal["off", "on", "trailing-strings"] = False,
        **kwargs: Any,
    ) -> Any:
        try:
            arguments = json.loads(input or "{}")
        except ValueError as exc:
            raise ModelRetry(
                f"the arguments are not valid JSON ({exc}); send a JSON object"
            ) from None
        return self.validate_python(arguments, allow_partial=allow_partial)

    def validate_python(
        self,
        input: Any,
        *,
        allow_partial: bool | Literal["off", "on", "trailing-strings"] = False,
        **kwargs: Any,
    ) -> Any:
        arguments = {} if input is None else input
        try:
            normalize_arguments(self.tool, arguments)
        except ArgumentValidationError as exc:
            raise ModelRetry(str(exc)) from None
        return dict(arguments)
