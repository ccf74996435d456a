"""The toolfleet branch an Agents SDK agent's tools run on (:class:`FleetBinding`): which SDK
tools go to the fleet, the fleet copy of each, and one call from the SDK's invoker to its
turn's batch and back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections import deque
from typing import Any

from toolfleet.adapters.openai_agents_approvals import parking_copy, settle_on_run
from toolfleet.adapters.openai_agents_calls import (
    BOUND,
    NOT_JSON,
    SOURCE,
    ToolShape,
    context_as_json,
    decode_arguments,
    rebuild_output,
    shape_of,
    warn_context_not_json,
)
from toolfleet.adapters.openai_agents_tools import context_preprocessor, takes_sdk_context
from toolfleet.adapters.openai_agents_turns import Turn
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.error_info import rebuild_error
from toolfleet.schemas.errors import CallError, ConfigurationError
from toolfleet.schemas.status import EventStatus

try:
    from agents import FunctionTool
    from agents.tool import with_function_tool_failure_error_handler
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"the OpenAI Agents SDK is not installed ({exc}); pip install 'toolfleet[openai-agents]'"
    ) from exc

__all__ = ["BOUND", "SOURCE", "FleetBinding", "FleetToolError"]

log = logging.getLogger(__name__)


class FleetToolError(CallError):
    """A call that ended on the fleet without an error of its own (a gate's denial).

    A call that failed raises its own exception instead, rebuilt on this side
    (:func:`toolfleet.schemas.rebuild_error`). Raised inside the SDK's tool invoker, so the
    tool's ``failure_error_function`` turns it into the text the model reads. ``str(error)`` is
    toolfleet's text (the gate's denial); ``result`` is the call's toolfleet result.
    """

    def __init__(self, result: ActionResponseModel) -> None:
        super().__init__(result.error or f"call ended {result.status.value}")
        self.result = result


class FleetBinding:
    """The toolfleet branch an agent's tools run on, and the gathering of each turn's calls."""

    def __init__(
        self,
        branch: Branch,
        *,
        call_params: CallParams | None = None,
        fleet_approvals: bool = False,
    ) -> None:
        self.branch = branch
        # needs_approval calls are parked in toolfleet's approvals too (openai_agents_approvals).
        self.fleet_approvals = fleet_approvals
        # Results stay in input order, one per call (a None is never dropped).
        params = call_params if call_params is not None else CallParams()
        self.call_params = params.model_copy(update={"output_dropna": False})
        self.agents: list[str] = []
        # How many calls each batch sent held, newest last (for tests and the bench).
        self.batch_sizes: deque[int] = deque(maxlen=10_000)
        # The turn still gathering calls, per (event loop, run).
        self._gathering: dict[tuple[int, int], Turn] = {}
        # (tool, context type) pairs already warned of a context with no JSON form.
        self._warned: set[tuple[str, type]] = set()

    @property
    def fleet(self) -> Fleet:
        return self.branch.fleet

    def plan(self, sdk_tool: Any, local: frozenset[str]) -> tuple[Any, bool]:
        """``(tool, True)`` when ``sdk_tool`` is to run on the fleet; ConfigurationError when
        it cannot (no toolfleet tool of its name, or another function under that name)."""
        if not isinstance(sdk_tool, FunctionTool):
            return sdk_tool, False
        source: FunctionTool = getattr(sdk_tool, SOURCE, sdk_tool)
        if source.name in local or source._is_agent_tool:
            # Kept in this process (an agent used as a tool: its own tools were visited).
            return source, False
        registry = self.fleet.registry
        if source.name not in registry:
            raise ConfigurationError(
                f"the agent's tool {source.name!r} is not a tool of the fleet's registry "
                f"(it has {registry.names()}); register the function with toolfleet's @tool "
                "or fleet_tool() in a module the workers load (TOOLFLEET_TOOLS), or keep it "
                f"in this process with on_fleet(..., local=[{source.name!r}])"
            )
        registered = registry.get(source.name)
        wrapped = _wrapped_callable(source)
        if wrapped is not None and wrapped is not registered.func_callable:
            raise ConfigurationError(
                f"the agent's tool {source.name!r} wraps {_qualname(wrapped)}, but the "
                f"fleet's tool of that name is {_qualname(registered.func_callable)}: the "
                "workers would run the fleet's; wrap the registered function"
            )
        if registered.preprocessor is not context_preprocessor and takes_sdk_context(
            registered.func_callable
        ):
            raise ConfigurationError(
                f"the tool {source.name!r} takes the SDK's run context: register it with "
                "toolfleet.adapters.openai_agents.fleet_tool, which sends the context along"
            )
        return source, True

    def fleet_copy(self, source: FunctionTool) -> FunctionTool:
        """A copy of ``source`` whose invoker sends its calls to this binding's branch."""
        registered = self.fleet.registry.get(source.name)
        context_param = None
        if registered.preprocessor is context_preprocessor:
            context_param = str(registered.preprocessor_kwargs["param"])
        shape = shape_of(
            source.name,
            registered.func_callable,
            strict=source.strict_json_schema,
            context_param=context_param,
        )

        parked = self.fleet_approvals and source.needs_approval is not False

        async def invoke(ctx: ToolContext[Any], arguments: str) -> Any:
            if parked:
                await settle_on_run(self, ctx.tool_call_id)
            return await self.invoke(shape, ctx, arguments)

        invoker = with_function_tool_failure_error_handler(invoke, _log_failure)
        copy = dataclasses.replace(source, on_invoke_tool=invoker)
        if parked:
            copy = parking_copy(self, copy, shape)
        setattr(copy, SOURCE, source)
        setattr(copy, BOUND, self)
        return copy

    async def invoke(self, shape: ToolShape, ctx: ToolContext[Any], arguments: str) -> Any:
        """Run one SDK call on the fleet, in its turn's batch: the tool's output as the SDK
        renders a local tool's; ModelBehaviorError for arguments the SDK would not run, before
        anything is sent; the call's exception, rebuilt, for a call that failed;
        FleetToolError for one that ended otherwise (denied)."""
        # A prepared (validated) local invocation has no use here: the workers validate.
        ctx._function_tool_arguments = None
        kept = decode_arguments(shape, arguments)
        if shape.context_param is not None:
            kept[shape.context_param] = self._context_argument(shape, ctx, kept)
        envelope = {"function": shape.name, "arguments": kept, "id": ctx.tool_call_id}
        # The SDK's calls of one run share its usage object: one run, one key.
        result = await self.submit(id(getattr(ctx, "usage", None)), envelope)
        if result.status is EventStatus.COMPLETED and result.error is None:
            return rebuild_output(shape, result.output)
        if result.error_info is not None:
            # The tool's own exception, by type, as failure_error_function would get it from
            # a local tool: no toolfleet wrapper as its cause.
            raise rebuild_error(result.error_info) from None
        raise FleetToolError(result)

    async def submit(self, run: int, envelope: dict[str, Any]) -> ActionResponseModel:
        """``envelope``'s result, from the batch of the calls of ``run`` gathered with it."""
        loop = asyncio.get_running_loop()
        key = (id(loop), run)
        turn = self._gathering.get(key)
        if turn is None:
            turn = self._gathering[key] = Turn(self, key, loop)
        return await turn.call(envelope)

    def turn_ended(self, turn: Turn) -> None:
        """``turn`` gathers no more calls: its run's next call starts a new one."""
        if self._gathering.get(turn.key) is turn:
            del self._gathering[turn.key]

    def _context_argument(
        self, shape: ToolShape, ctx: ToolContext[Any], kept: dict[str, Any]
    ) -> dict[str, Any]:
        """What a fleet_tool's hidden parameter carries to the worker: the framework's
        context, never a value the model sent under that name (decode_arguments dropped it)."""
        context = context_as_json(ctx.context)
        if context is NOT_JSON:
            seen = (shape.name, type(ctx.context))
            if seen not in self._warned:
                self._warned.add(seen)
                warn_context_not_json(shape.name, ctx.context)
            context = None
        return {
            "context": context,
            "tool_name": ctx.tool_name,
            "tool_call_id": ctx.tool_call_id,
            # The arguments as sent: keys the schema does not name are not among them.
            "tool_arguments": json.dumps(kept),
        }


def _wrapped_callable(sdk_tool: FunctionTool) -> Any:
    try:
        return sdk_tool.__wrapped__
    except AttributeError:
        return None


def _qualname(func: Any) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def _log_failure(tool: FunctionTool, error: Exception, arguments: str) -> None:
    log.debug("fleet tool %s failed: %s", tool.name, error)
