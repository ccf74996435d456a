"""The SDK's ``needs_approval`` as toolfleet approvals (``on_fleet(..., fleet_approvals=True)``).

The SDK decides approval in the caller's process, before the invoker runs: a call that needs
it interrupts the run (``RunResult.interruptions``), and ``RunState.approve``/``reject`` decide
it for the resumed run. With ``fleet_approvals``, each such call is also parked in toolfleet's
approvals (Redis), so whoever can reach the broker lists it (``toolfleet approvals``,
``Fleet.approvals()``) and decides it (``toolfleet approve``/``deny``, ``Fleet.approve``/
``deny``); :func:`fleet_decisions` waits for those decisions and applies them to the run's
``RunState``, which the SDK's own flow resumes. A call approved in the ``RunState`` directly
is marked approved in toolfleet when it runs.

A parked request has an id of its own (derived from the call's), not the call's: it stands
for the SDK's decision, and the call itself goes through ``act()`` once the run resumes.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import uuid
from typing import Any, Protocol, cast

from toolfleet.adapters.openai_agents_calls import BOUND, ToolShape
from toolfleet.dispatcher.accept.context import call_id_for
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.approvals import decide, load_approval, park, wait_for_decision
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.approval import DEFAULT_APPROVAL_TIMEOUT_S, ApprovalRequest
from toolfleet.schemas.errors import ApprovalError, ConfigurationError
from toolfleet.schemas.record import bounded_arguments, shown_arguments

try:
    from agents import FunctionTool, RunContextWrapper
    from agents.items import ToolApprovalItem
    from agents.result import RunResult, RunResultStreaming
    from agents.run_state import RunState
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"the OpenAI Agents SDK is not installed ({exc}); pip install 'toolfleet[openai-agents]'"
    ) from exc


class FleetBinding(Protocol):
    """What of an agent's binding (``openai_agents_binding.FleetBinding``) approvals use."""

    @property
    def branch(self) -> Branch: ...

    @property
    def fleet(self) -> Fleet: ...

    @property
    def call_params(self) -> CallParams: ...


__all__ = ["approval_id", "fleet_decisions", "parking_copy", "settle_on_run"]

# The namespace of the parked requests' ids (one per call id).
_APPROVAL_NAMESPACE = uuid.UUID("5b0e7d55-6a0c-4f43-9a53-0c1e6f7b2d91")


def approval_id(binding: FleetBinding, tool_call_id: str) -> str:
    """The id toolfleet lists the SDK's approval of ``tool_call_id`` under."""
    call_id = call_id_for(binding.branch.id, tool_call_id)
    return str(uuid.uuid5(_APPROVAL_NAMESPACE, call_id))


def parking_copy(binding: FleetBinding, copy: FunctionTool, shape: ToolShape) -> FunctionTool:
    """``copy`` whose ``needs_approval`` also parks each call it stops in toolfleet."""
    policy = copy.needs_approval
    if policy is False:
        return copy

    async def needs_approval(
        ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
    ) -> bool:
        verdict: Any = policy(ctx, params, call_id) if callable(policy) else policy
        needed = bool(await verdict) if inspect.isawaitable(verdict) else bool(verdict)
        if needed:
            await _park(binding, shape, params, call_id)
        return needed

    return dataclasses.replace(copy, needs_approval=needs_approval)


async def _park(
    binding: FleetBinding, shape: ToolShape, params: dict[str, Any], tool_call_id: str
) -> None:
    fleet = binding.fleet
    secrets = fleet.registry.get(shape.name).secret_args
    named = shape.argument_names
    # What a decider sees: the named arguments only (the model's other keys never leave),
    # secrets redacted.
    kept = {k: v for k, v in params.items() if named is None or k in named}
    now_s = time.time()
    request = ApprovalRequest(
        call_id=approval_id(binding, tool_call_id),
        tool=shape.name,
        arguments=bounded_arguments(shown_arguments(kept, secrets), secrets),
        branch_id=binding.branch.id,
        tool_call_id=tool_call_id,
        reason=f"tool {shape.name!r} needs approval (the Agents SDK's needs_approval)",
        requested_at=now_s,
        expires_at=now_s + binding.call_params.approval_timeout_s,
    )
    await park(
        fleet.redis,
        fleet.keys,
        request,
        message="",
        route={},
        ttl_s=fleet.settings.record_ttl_s,
    )


async def settle_on_run(binding: FleetBinding, tool_call_id: str) -> None:
    """A parked call about to run was approved in the SDK's RunState: say so in toolfleet."""
    fleet = binding.fleet
    parked_id = approval_id(binding, tool_call_id)
    request = await load_approval(fleet.redis, fleet.keys, parked_id)
    if request is not None and request.waiting:
        try:
            await decide(
                fleet.redis, fleet.keys, parked_id, "approved", by="the Agents SDK's RunState"
            )
        except ApprovalError:
            pass  # decided in toolfleet meanwhile: the SDK's decision is the one that ran


async def fleet_decisions(
    result: RunResult | RunResultStreaming, *, timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S
) -> RunState[Any]:
    """The run's state with each interruption parked on the fleet decided as toolfleet
    decides it (approved; denied or expired: rejected, and the model reads toolfleet's
    refusal text). Waits for each decision up to its approval time (at most ``timeout_s``).
    Interruptions of tools not on the fleet are left for the caller to decide."""
    state = result.to_state()
    for item in result.interruptions:
        binding = _binding_of_item(item)
        if binding is None:
            continue
        tool_call_id = _call_id_of(item)
        if tool_call_id is None:
            continue
        fleet = binding.fleet
        request = await load_approval(fleet.redis, fleet.keys, approval_id(binding, tool_call_id))
        if request is None:
            continue
        if request.waiting:
            deadline = min(request.expires_at, time.time() + timeout_s)
            request = await wait_for_decision(
                fleet.redis, fleet.keys, request.model_copy(update={"expires_at": deadline})
            )
        if request.approved:
            state.approve(item)
        else:
            state.reject(item, rejection_message=request.refusal_text())
    return state


def _binding_of_item(item: ToolApprovalItem) -> FleetBinding | None:
    agent = item.agent
    for t in getattr(agent, "tools", ()):
        if getattr(t, "name", None) == item.tool_name:
            found = getattr(t, BOUND, None)
            if found is not None:
                return cast(FleetBinding, found)
    return None


def _call_id_of(item: ToolApprovalItem) -> str | None:
    raw = item.raw_item
    value = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
    return str(value) if value else None
