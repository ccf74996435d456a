"""OpenAI Agents SDK on the fleet: ``on_fleet(agent)`` and the agent's function tools run on
toolfleet's workers (``pip install "toolfleet[openai-agents]"``).

The SDK runs one model turn's tool calls as one task each, which reach
``FunctionTool.on_invoke_tool`` together. ``on_fleet`` gives every function tool of the agent
(and of the agents it hands off to or uses as tools) an invoker that sends its call to the
fleet: the calls of one turn of one run are gathered (:data:`GATHER_TICKS`) into **one**
``Branch.act`` batch, in the order they arrived (the model's), each under the SDK's
``tool_call_id``, from which history's ids and the idempotency key (C7) derive. Each agent tool
must be a toolfleet tool of the same name (``@tool`` wrapped by the SDK's ``function_tool``, or
:func:`fleet_tool`). A call that does not complete raises :class:`FleetToolError` in the SDK's
invoker, so the model reads what the tool's ``failure_error_function`` makes of it.
docs/agent-ecosystem.md, "OpenAI Agents SDK on the fleet", has the rules.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections import deque
from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel

from toolfleet.adapters.openai_agents_tools import (
    context_preprocessor,
    fleet_tool,
    takes_sdk_context,
)
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.session import Session
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.errors import CallError, ConfigurationError
from toolfleet.schemas.status import EventStatus

try:
    from agents import Agent, FunctionTool, Handoff
    from agents.tool import with_function_tool_failure_error_handler
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"the OpenAI Agents SDK is not installed ({exc}); pip install 'toolfleet[openai-agents]'"
    ) from exc

__all__ = [
    "GATHER_MAX_TICKS", "GATHER_TICKS", "FleetBinding", "FleetToolError", "binding_of",
    "fleet_tool", "on_fleet",
]  # fmt: skip

log = logging.getLogger(__name__)

# The calls of one turn are gathered until the event loop has gone round this many times
# without a new one (the SDK's calls of one turn arrive in the same round), and for at most
# GATHER_MAX_TICKS rounds in all.
GATHER_TICKS = 3
GATHER_MAX_TICKS = 100
# The attribute that marks an agent's fleet copy of a FunctionTool (its value: the binding).
_BOUND = "_toolfleet_binding"
# The attribute that holds the FunctionTool a fleet copy was made from.
_SOURCE = "_toolfleet_source"

AgentT = TypeVar("AgentT", bound=Agent[Any])


class FleetToolError(CallError):
    """A call that did not complete on the fleet (failed, aborted, cancelled or denied).

    Raised inside the SDK's tool invoker, so the tool's ``failure_error_function`` turns it
    into the text the model reads. ``str(error)`` is toolfleet's error text
    (``"<Type>: <message>"``, or the gate's denial); ``result`` is the call's toolfleet result.
    """

    def __init__(self, result: ActionResponseModel) -> None:
        super().__init__(result.error or f"call ended {result.status.value}")
        self.result = result


def on_fleet(
    agent: AgentT,
    *,
    fleet: Fleet | None = None,
    branch: Branch | None = None,
    session: Session | None = None,
    call_params: CallParams | None = None,
    local: Iterable[str] = (),
) -> AgentT:
    """Put ``agent``'s function tools on the fleet and return the agent (the same object).

    Every ``FunctionTool`` of ``agent``, of the agents it hands off to and of the agents it
    uses as tools (each agent once) is replaced, in its agent's ``tools``, by a copy whose
    invoker sends the call to the fleet; everything else about the tool (schema, approval,
    guardrails, ``failure_error_function``) is the SDK's as before. Agents used as tools
    stay tools of the caller's process (their run is the SDK's), with their own tools on the
    fleet. Calling it again rebinds the agents to the new branch.

    The calls go to ``branch`` (toolfleet's history of them is under ``branch.id``:
    ``toolfleet history <branch.id>``), else to a new ``Branch(session, fleet=fleet)``; the
    branch's TOOL_PRE hooks and its session's gates apply to every call. ``call_params`` are
    each batch's (retries, timeout, window). Each tool's name must be a tool of the fleet's
    registry (the workers run that one), unless it is named in ``local``: those keep running
    in this process.
    """
    if not isinstance(agent, Agent):
        raise ConfigurationError(
            f"on_fleet() takes an agents.Agent, got {type(agent).__name__}; for a lionagi "
            "Branch use toolfleet.adapters.lionagi.on_fleet"
        )
    if branch is None:
        branch = Branch(session, fleet=fleet)
    elif fleet is not None or session is not None:
        raise ConfigurationError(
            "on_fleet(): pass branch=, or fleet=/session= for a new branch, not both"
        )
    binding = FleetBinding(branch, call_params=call_params)
    keep = frozenset(local)
    agents = _reachable(agent)
    # Checked for every agent first, so a refusal leaves every agent as it was.
    planned = [(a, [binding.plan(t, keep) for t in a.tools]) for a in agents]
    for a, tools in planned:
        a.tools = [binding.fleet_copy(t) if put else t for t, put in tools]
    binding.agents = [a.name for a in agents]
    return agent


def binding_of(agent: Agent[Any]) -> FleetBinding | None:
    """The binding of an agent put on a fleet (its branch: ``binding_of(agent).branch``)."""
    for t in agent.tools:
        binding = getattr(t, _BOUND, None)
        if isinstance(binding, FleetBinding):
            return binding
    return None


class FleetBinding:
    """The toolfleet branch an agent's tools run on, and the gathering of each turn's calls."""

    def __init__(self, branch: Branch, *, call_params: CallParams | None = None) -> None:
        self.branch = branch
        # Results stay in input order, one per call (a None is never dropped).
        params = call_params if call_params is not None else CallParams()
        self.call_params = params.model_copy(update={"output_dropna": False})
        self.agents: list[str] = []
        # How many calls each batch sent held, newest last (for tests and the bench).
        self.batch_sizes: deque[int] = deque(maxlen=10_000)
        # The turn still gathering calls, per (event loop, run).
        self._gathering: dict[tuple[int, int], _Turn] = {}

    @property
    def fleet(self) -> Fleet:
        return self.branch.fleet

    def plan(self, sdk_tool: Any, local: frozenset[str]) -> tuple[Any, bool]:
        """``(tool, True)`` when ``sdk_tool`` is to run on the fleet; ConfigurationError when
        it cannot (no toolfleet tool of its name, or another function under that name)."""
        if not isinstance(sdk_tool, FunctionTool):
            return sdk_tool, False
        source: FunctionTool = getattr(sdk_tool, _SOURCE, sdk_tool)
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
        name = source.name

        async def invoke(ctx: ToolContext[Any], arguments: str) -> Any:
            return await self.invoke(name, ctx, arguments)

        invoker = with_function_tool_failure_error_handler(invoke, _log_failure)
        copy = dataclasses.replace(source, on_invoke_tool=invoker)
        setattr(copy, _SOURCE, source)
        setattr(copy, _BOUND, self)
        return copy

    async def invoke(self, function: str, ctx: ToolContext[Any], arguments: str) -> Any:
        """Run one SDK call on the fleet, in its turn's batch; the tool's output, or raise
        FleetToolError."""
        # A prepared (validated) local invocation has no use here: the workers validate.
        ctx._function_tool_arguments = None
        envelope = {
            "function": function,
            "arguments": self._arguments(function, ctx, arguments),
            "id": ctx.tool_call_id,
        }
        # The SDK's calls of one run share its usage object: one run, one key.
        result = await self.submit(id(getattr(ctx, "usage", None)), envelope)
        if result.status is EventStatus.COMPLETED and result.error is None:
            return result.output
        raise FleetToolError(result)

    async def submit(self, run: int, envelope: dict[str, Any]) -> ActionResponseModel:
        """``envelope``'s result, from the batch of the calls of ``run`` gathered with it."""
        loop = asyncio.get_running_loop()
        key = (id(loop), run)
        turn = self._gathering.get(key)
        if turn is None:
            turn = self._gathering[key] = _Turn(self, key, loop)
        return await turn.call(envelope)

    def _arguments(self, function: str, ctx: ToolContext[Any], arguments: str) -> Any:
        tool = self.fleet.registry.get(function)
        if tool.preprocessor is not context_preprocessor:
            return arguments  # toolfleet decodes the JSON text (or names what is wrong with it)
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments  # the call's argument error, as for any tool
        if not isinstance(decoded, dict):
            return arguments
        param = tool.preprocessor_kwargs["param"]
        decoded[param] = {
            "context": _json_context(ctx.context),
            "tool_name": ctx.tool_name,
            "tool_call_id": ctx.tool_call_id,
            "tool_arguments": ctx.tool_arguments,
        }
        return decoded


class _Turn:
    """The calls of one model turn: gathered, sent as one act(), answered in order."""

    def __init__(
        self, binding: FleetBinding, key: tuple[int, int], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.binding = binding
        self.key = key
        self.envelopes: list[dict[str, Any]] = []
        self.futures: list[asyncio.Future[ActionResponseModel]] = []
        self.waiting = 0
        self.task = loop.create_task(self._gather_and_act())

    async def call(self, envelope: dict[str, Any]) -> ActionResponseModel:
        future: asyncio.Future[ActionResponseModel] = asyncio.get_running_loop().create_future()
        self.envelopes.append(envelope)
        self.futures.append(future)
        self.waiting += 1
        try:
            result = await future
        except asyncio.CancelledError:
            self.waiting -= 1
            if self.waiting == 0 and not self.task.done():
                # Every call of the turn is abandoned (the run was cancelled): cancel the
                # act(), which revokes the queued calls, cancels the running async ones and
                # records them CANCELLED (C9); wait for that before the cancel goes on.
                self.task.cancel()
                await asyncio.wait([self.task])
            raise
        except BaseException:
            self.waiting -= 1
            raise
        self.waiting -= 1
        return result

    async def _gather_and_act(self) -> None:
        try:
            await self._gather()
            sent = [i for i, f in enumerate(self.futures) if not f.done()]
            if sent:
                await self._act(sent)
        except BaseException as exc:
            # Nobody may wait for ever: a call not answered ends with what ended the turn.
            for future in self.futures:
                if future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    async def _gather(self) -> None:
        try:
            seen, quiet = 0, 0
            for _ in range(GATHER_MAX_TICKS):
                if quiet >= GATHER_TICKS:
                    break
                await asyncio.sleep(0)
                if len(self.envelopes) == seen:
                    quiet += 1
                else:
                    seen, quiet = len(self.envelopes), 0
        finally:
            # Later calls of this run start a new turn.
            if self.binding._gathering.get(self.key) is self:
                del self.binding._gathering[self.key]

    async def _act(self, sent: list[int]) -> None:
        self.binding.batch_sizes.append(len(sent))
        results = await self.binding.branch.act(
            [self.envelopes[i] for i in sent], call_params=self.binding.call_params
        )
        for i, result in zip(sent, results, strict=True):
            future = self.futures[i]
            if future.done():
                continue  # its SDK task was cancelled on its own (a timeout): result unread
            if isinstance(result, ActionResponseModel):
                future.set_result(result)
            else:
                future.set_exception(RuntimeError(f"no result for the call: {result!r}"))


def _json_context(value: Any) -> Any:
    """The run context as JSON, when it is JSON (a pydantic model as its JSON dump); None
    otherwise: a context of live objects stays in the caller's process."""
    try:
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json")
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        log.debug("run context of type %s is not JSON: not sent", type(value).__name__)
        return None
    return value


def _wrapped_callable(sdk_tool: FunctionTool) -> Any:
    try:
        return sdk_tool.__wrapped__
    except AttributeError:
        return None


def _qualname(func: Any) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def _log_failure(tool: FunctionTool, error: Exception, arguments: str) -> None:
    log.debug("fleet tool %s failed: %s", tool.name, error)


def _reachable(agent: Agent[Any]) -> list[Agent[Any]]:
    """``agent``, the agents it hands off to and the agents it uses as tools, recursively,
    each once."""
    found: list[Agent[Any]] = []
    seen: set[int] = set()
    stack: list[Any] = [agent]
    while stack:
        current = stack.pop()
        if not isinstance(current, Agent) or id(current) in seen:
            continue
        seen.add(id(current))
        found.append(current)
        for handoff in current.handoffs:
            stack.append(_handoff_agent(handoff))
        for t in current.tools:
            if isinstance(t, FunctionTool) and t._is_agent_tool:
                stack.append(t._agent_instance)
    return found


def _handoff_agent(handoff: Any) -> Any:
    if isinstance(handoff, Agent):
        return handoff
    if isinstance(handoff, Handoff):
        ref = getattr(handoff, "_agent_ref", None)
        target = ref() if callable(ref) else None
        if target is None:
            log.warning(
                "on_fleet: handoff %r names no agent it can reach; put that agent on the "
                "fleet itself",
                handoff.tool_name,
            )
        return target
    return None
