"""OpenAI Agents SDK on the fleet: ``on_fleet(agent)`` and the agent's function tools run on
toolfleet's workers (``pip install "toolfleet[openai-agents]"``).

The SDK runs one model turn's tool calls as one task each, which reach
``FunctionTool.on_invoke_tool`` together. ``on_fleet`` gives every function tool of the agent
(and of the agents it hands off to or uses as tools) an invoker that sends its call to the
fleet: the calls of one turn of one run are gathered (:data:`GATHER_TICKS`) into **one**
``Branch.act`` batch, in the order they arrived (the model's), each under the SDK's
``tool_call_id``, from which history's ids and the idempotency key (C7) derive. Each agent tool
must be a toolfleet tool of the same name (``@tool`` wrapped by the SDK's ``function_tool``, or
:func:`fleet_tool`). A call behaves as the SDK's own executor would run it locally: arguments
parsed by the SDK's rules before anything is sent (keys the schema does not name, the hidden
context parameter's among them, never leave), the tool's own exception rebuilt by type for its
``failure_error_function``, the output rebuilt to the declared return type.
docs/agent-ecosystem.md, "OpenAI Agents SDK on the fleet", has the rules.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, TypeVar

from toolfleet.adapters.openai_agents_approvals import fleet_decisions
from toolfleet.adapters.openai_agents_binding import BOUND, FleetBinding, FleetToolError
from toolfleet.adapters.openai_agents_tools import fleet_tool
from toolfleet.adapters.openai_agents_turns import GATHER_MAX_TICKS, GATHER_TICKS
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.session import Session
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.errors import ConfigurationError

try:
    from agents import Agent, FunctionTool, Handoff
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"the OpenAI Agents SDK is not installed ({exc}); pip install 'toolfleet[openai-agents]'"
    ) from exc

__all__ = [
    "GATHER_MAX_TICKS", "GATHER_TICKS", "FleetBinding", "FleetToolError", "binding_of",
    "fleet_decisions", "fleet_tool", "on_fleet",
]  # fmt: skip

log = logging.getLogger(__name__)

AgentT = TypeVar("AgentT", bound=Agent[Any])


def on_fleet(
    agent: AgentT,
    *,
    fleet: Fleet | None = None,
    branch: Branch | None = None,
    session: Session | None = None,
    call_params: CallParams | None = None,
    local: Iterable[str] = (),
    fleet_approvals: bool = False,
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

    ``fleet_approvals=True`` (off by default: the SDK decides approvals in its ``RunState``
    only) also parks each call a tool's ``needs_approval`` stops in toolfleet's approvals:
    listed and decided from anywhere, and applied to the run by :func:`fleet_decisions`.
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
    binding = FleetBinding(branch, call_params=call_params, fleet_approvals=fleet_approvals)
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
        binding = getattr(t, BOUND, None)
        if isinstance(binding, FleetBinding):
            return binding
    return None


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
