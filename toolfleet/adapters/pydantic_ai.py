"""Pydantic AI on the fleet: ``FleetToolset`` is a Pydantic AI toolset whose tools are the
fleet's and whose calls run on toolfleet's workers.

``pip install "toolfleet[pydantic-ai]"``, then::

    agent = Agent(model, toolsets=[FleetToolset(fleet=Fleet.from_env())])

- **One turn, one batch.** Pydantic AI runs a turn's parallel calls as one task each, and each
  reaches ``call_tool``; the calls that arrive together (the same few event-loop ticks, the same
  run) are sent as one ``Branch.act`` batch (``toolfleet.adapters._turns.TurnBatcher``), in the
  model's order, each call under the model's ``tool_call_id``.
- **Specs and arguments, as a local tool's.** A fleet tool's definition and argument
  validation are Pydantic AI's own ``Tool`` of the function (its schema, its retry prompts for
  extra keys or invalid JSON); a tool with a request model or processors keeps toolfleet's
  spec and check. Nothing is sent until the arguments pass.
- **The run context never comes from the model.** A tool registered with
  :func:`fleet_tool` whose first parameter is ``RunContext`` shows no such parameter to the
  model; a value the model sends under its name is dropped, and the run's own context is
  sent instead (deps as JSON, a secret argument), rebuilt on the worker
  (:mod:`toolfleet.adapters.pydantic_ai_tools`).
- **Outcomes, as a local tool's.** ``ModelRetry``, ``ToolFailed``, ``ApprovalRequired`` and
  ``CallDeferred`` raised on a worker are raised here; any other exception is rebuilt by type
  and ends the run (:mod:`toolfleet.adapters.pydantic_ai_results` has the whole mapping).
- **Approvals.** A tool declared ``approval=True`` requires approval as Pydantic AI's
  ``requires_approval`` does: the run ends with ``DeferredToolRequests``, and a call approved
  in ``DeferredToolResults`` passes toolfleet's approval step (recorded, decided by this
  toolset's handler). ``approvals="fleet"``: the call waits for ``toolfleet approve`` instead.
- **Conversations.** The calls of a run act on the branch ``"pydantic-ai:<conversation_id>"``
  (``toolfleet history pydantic-ai:<id>``); call ids derive from the model's tool-call ids in
  it, so replaying a turn does not run its tools again (C7). ``branch=`` puts every call on one
  branch; ``session=`` adds gates and observers; :attr:`FleetToolset.hooks` holds TOOL_PRE /
  TOOL_POST / TOOL_ERROR handlers (``policy.pre_hook()`` of a ``PermissionPolicy``).
- **Cancellation.** Cancelling the run cancels the turn's tasks, and with them the batch: queued
  calls are revoked, running async ones cancelled on their workers, all recorded CANCELLED (C9).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any, Literal

import pydantic_core
from pydantic import TypeAdapter

from toolfleet.schemas.errors import ConfigurationError

try:
    from pydantic_ai import RunContext
    from pydantic_ai import Tool as PydanticAITool
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_ai.toolsets.abstract import SchemaValidatorProt
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"Pydantic AI is not installed ({exc}); pip install 'toolfleet[pydantic-ai]'"
    ) from exc

from toolfleet.adapters._turns import Conversations, TurnBatcher
from toolfleet.adapters._turns import fleet_tool as registered_tool
from toolfleet.adapters.pydantic_ai_arguments import ArgumentsCheck, LocalArguments
from toolfleet.adapters.pydantic_ai_results import ToolfleetToolError, answer
from toolfleet.adapters.pydantic_ai_tools import (
    FleetRunContext,
    context_parameter,
    run_context_preprocessor,
)
from toolfleet.adapters.pydantic_ai_tools import fleet_tool as fleet_tool
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.hooks import HookBus
from toolfleet.dispatcher.session import Session
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.approval import ApprovalRequest
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.tool import Tool

__all__ = ["APPROVED_SUFFIX", "FleetToolset", "ToolfleetToolError", "answer", "fleet_tool"]

# What an approved call's id in toolfleet's history ends with, after the model's tool-call id.
APPROVED_SUFFIX = "#approved"


class FleetToolset(AbstractToolset[Any]):
    """A Pydantic AI toolset of fleet tools, run on toolfleet's workers.

    ``tools``: names of registered toolfleet tools, toolfleet ``Tool``s or ``@tool``
    functions; None for every tool of the fleet's registry. ``fleet``: default the branch's,
    the session's, else ``Fleet.from_env()``. ``max_retries``: per tool, None for the agent's.
    ``call_params``: toolfleet's batch controls (timeout, retries on the fleet, window).

    Two defaults differ from a local tool only when asked: ``tool_errors_as_results=True``
    makes a tool's exception a failed result the model reads (toolfleet's C1) instead of
    ending the run; ``approvals="fleet"`` makes a call of an approval tool wait, parked in
    Redis, for ``toolfleet approve`` / ``fleet.approve`` instead of ending the run with
    ``DeferredToolRequests``.
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
        tool_errors_as_results: bool = False,
        approvals: Literal["pydantic-ai", "fleet"] = "pydantic-ai",
        id: str | None = None,
    ) -> None:
        if approvals not in ("pydantic-ai", "fleet"):
            raise ConfigurationError(
                f"approvals={approvals!r}: pass 'pydantic-ai' (DeferredToolRequests) or 'fleet' "
                "(the call waits for toolfleet approve)"
            )
        self.conversations = Conversations(
            "pydantic-ai", fleet=fleet, branch=branch, session=session
        )
        registry = self.conversations.fleet.registry
        chosen = list(registry) if tools is None else [registered_tool(registry, t) for t in tools]
        specs = registry.specs("openai", names=[t.function for t in chosen])
        self._tools = {
            t.function: _FleetTool.of(t, dict(spec["function"]), defer=approvals == "pydantic-ai")
            for t, spec in zip(chosen, specs, strict=True)
        }
        self.max_retries = max_retries
        self.call_params = call_params
        self.tool_errors_as_results = tool_errors_as_results
        self.batcher = TurnBatcher()
        self._id = id
        # Calls Pydantic AI approved (DeferredToolResults), by (branch, tool call id): the
        # fleet parks them as any call of an approval tool, and this process approves them.
        self._approved: set[tuple[str | None, str]] = set()
        if any(t.tool.approval for t in self._tools.values()):
            self.fleet.on_approval(self._approve_what_the_run_approved)

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

    def definitions(self) -> list[ToolDefinition]:
        """The tools' definitions, as the model is shown them."""
        return [t.definition for t in self._tools.values()]

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        max_retries = self.max_retries if self.max_retries is not None else ctx.max_retries
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=fleet.definition,
                max_retries=max_retries,
                args_validator=fleet.validator,
            )
            for name, fleet in self._tools.items()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        conversation = ctx.conversation_id
        fleet = self._tools[name]
        envelope: dict[str, Any] = {"function": name, "arguments": fleet.arguments(tool_args, ctx)}
        if ctx.tool_call_id:
            envelope["id"] = ctx.tool_call_id
            if ctx.tool_call_approved:
                # An approved call is a new call: the same id would be answered from the
                # record of the one that asked for approval (C7) instead of running.
                envelope["id"] = f"{ctx.tool_call_id}{APPROVED_SUFFIX}"
                if fleet.tool.approval:
                    self._approved.add((self.branch_id(conversation), envelope["id"]))
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
        return answer(
            result, returns=fleet.returns, tool_errors_as_results=self.tool_errors_as_results
        )

    def _approve_what_the_run_approved(self, request: ApprovalRequest) -> bool | None:
        """Approval handler: True for a call the run approved through Pydantic AI's
        ``DeferredToolResults``; None (left to other deciders) for any other."""
        if request.tool_call_id is None:
            return None
        for key in ((request.branch_id, request.tool_call_id), (None, request.tool_call_id)):
            if key in self._approved:
                self._approved.discard(key)  # one approval, one call
                return True
        return None


@dataclasses.dataclass
class _FleetTool:
    """One fleet tool as Pydantic AI sees it: its definition, its argument validator and, for
    a tool taking ``RunContext``, the parameter the run context is sent under."""

    tool: Tool
    definition: ToolDefinition
    validator: SchemaValidatorProt
    context_param: str | None = None
    returns: TypeAdapter[Any] | None = None

    @classmethod
    def of(cls, tool: Tool, spec: dict[str, Any], *, defer: bool) -> _FleetTool:
        """``defer``: a tool declared ``approval=True`` is Pydantic AI's ``requires_approval``
        (the run ends with ``DeferredToolRequests`` until approved)."""
        param: str | None = None
        if tool.preprocessor is run_context_preprocessor:
            param = str(tool.preprocessor_kwargs["param"])
        elif tool.preprocessor is None and context_parameter(tool.func_callable) is not None:
            raise ConfigurationError(
                f"the tool {tool.function!r} takes Pydantic AI's RunContext, but is registered "
                "with toolfleet's @tool, which cannot rebuild it on a worker; register it with "
                "toolfleet.adapters.pydantic_ai.fleet_tool"
            )
        kind: Literal["function", "unapproved"] = (
            "unapproved" if tool.approval and defer else "function"
        )
        local = _as_local_tool(tool, param)
        if local is None:
            definition = ToolDefinition(
                name=spec["name"],
                description=spec.get("description"),
                parameters_json_schema=dict(spec.get("parameters") or {}),
                metadata={"toolfleet": True},
                kind=kind,
            )
            return cls(tool, definition, ArgumentsCheck(tool, param), param)
        # Pydantic AI's own definition and validator of the function, as for a local tool.
        definition = dataclasses.replace(local.tool_def, metadata={"toolfleet": True}, kind=kind)
        return cls(tool, definition, LocalArguments(local, param), param, _returns(local))

    def arguments(self, validated: dict[str, Any], ctx: RunContext[Any]) -> dict[str, Any]:
        """What is sent: the validated arguments as JSON, and the run context under its
        parameter (refused, naming the tool and type, when the run's deps are not JSON)."""
        arguments = dict(validated)
        if isinstance(self.validator, LocalArguments):
            schema = self.validator.local.function_schema
            arguments = schema.dump_json_parameters(arguments, by_alias=False, round_trip=True)
        arguments = pydantic_core.to_jsonable_python(arguments)
        if self.context_param is not None:
            arguments[self.context_param] = {
                "deps": _json_deps(self.tool.function, ctx.deps),
                "run": _json_run(ctx),
            }
        return arguments


def _as_local_tool(tool: Tool, context_param: str | None) -> PydanticAITool[Any] | None:
    """Pydantic AI's ``Tool`` of a fleet tool's function, when the fleet runs that function as
    it is (no request model, no processors but the run context's): its schema and validation
    are then exactly a local tool's. None for any other tool (toolfleet's spec is used)."""
    if tool.request_options is not None and context_param is None:
        return None
    if tool.preprocessor not in (None, run_context_preprocessor) or tool.postprocessor:
        return None
    try:
        return PydanticAITool(tool.func_callable, name=tool.function)
    except Exception:  # a signature Pydantic AI cannot read: toolfleet's spec stands
        return None


def _returns(local: PydanticAITool[Any]) -> TypeAdapter[Any] | None:
    """The function's declared return type, to rebuild a JSON result as it (None: leave it)."""
    try:
        declared = typing.get_type_hints(local.function).get("return")
    except Exception:
        return None
    if declared is None or declared in (Any, object, type(None)):
        return None
    try:
        return TypeAdapter(declared)
    except Exception:  # a type pydantic cannot build: the JSON result stands
        return None


def _json_deps(function: str, deps: Any) -> Any:
    try:
        return pydantic_core.to_jsonable_python(deps)
    except pydantic_core.PydanticSerializationError as exc:
        raise ConfigurationError(
            f"the tool {function!r} takes RunContext, but the run's deps "
            f"({type(deps).__name__}) are not JSON ({exc}); run it with deps that serialize "
            "to JSON (a dict, a dataclass or pydantic model of JSON values), or keep the tool "
            "in the agent's process"
        ) from None


def _json_run(ctx: RunContext[Any]) -> dict[str, Any]:
    """The run context's fields that Pydantic AI's durable execution carries to another
    worker, as JSON; a field whose value is not JSON stays behind (reading it on the worker
    raises, saying why)."""
    carried: dict[str, Any] = {}
    for name, value in FleetRunContext.serialize_run_context(ctx).items():
        try:
            carried[name] = pydantic_core.to_jsonable_python(value)
        except pydantic_core.PydanticSerializationError:
            continue
    return carried
