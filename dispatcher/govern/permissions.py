"""Per-tool permission policy (ADR-0012 D5), checked against the normalized call context."""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from toolfleet.dispatcher.accept.context import CallContext
from toolfleet.dispatcher.govern.approvals import Escalate
from toolfleet.dispatcher.govern.callbacks import call_user
from toolfleet.dispatcher.govern.hooks import HookHandler, HookPoint
from toolfleet.schemas.action import ToolInvocation
from toolfleet.schemas.errors import (
    ApprovalRequired,
    ConfigurationError,
    PolicyDeniedError,
    WrongTypeError,
)

if TYPE_CHECKING:
    from toolfleet.dispatcher.branch import Branch

__all__ = ["Decision", "PermissionDecision", "PermissionPolicy"]

Decision = Literal["allow", "deny", "escalate"]
_MODES = ("allow_all", "deny_all")


@dataclass(frozen=True, slots=True)
class PermissionDecision:
    decision: Decision
    reason: str

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"


@dataclass
class PermissionPolicy:
    """Rules mapping a tool name (or ``"*"``) to glob patterns over the call's *action*.

    The action is ``str(args[action_arg])`` (``""`` when absent). Precedence: deny, then
    allow, then escalate, then the mode's default (``allow_all`` allows, ``deny_all``
    denies) — lionagi's order, so ``escalate={"bash": ["*"]}`` plus ``allow`` rules
    escalates only what no allow rule names. With ``on_escalate``, an escalated call is
    allowed only when ``on_escalate(tool_name, action, args)`` returns truthy (lionagi's D5,
    decided in this process). Without it, the call is parked for approval in Redis, for
    ``toolfleet approve``/``deny``, ``Fleet.approve``/``deny`` or an approval handler
    (docs/controls.md); :meth:`to_pre_hook`, which runs on a worker, denies it instead.
    """

    mode: str = "allow_all"
    allow: dict[str, list[str]] = field(default_factory=dict)
    deny: dict[str, list[str]] = field(default_factory=dict)
    escalate: dict[str, list[str]] = field(default_factory=dict)
    on_escalate: Callable[..., Any] | None = None
    action_arg: str = "action"

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ConfigurationError(
                f"PermissionPolicy mode {self.mode!r} is not one of {list(_MODES)}"
            )

    def action_of(self, args: Mapping[str, Any]) -> str:
        value = args.get(self.action_arg)
        return "" if value is None else str(value)

    def check(self, tool_name: str, action: str, args: Mapping[str, Any]) -> PermissionDecision:
        """Decide without side effects; an escalation is returned, not resolved."""
        for decision, rules in (
            ("deny", self.deny),
            ("allow", self.allow),
            ("escalate", self.escalate),
        ):
            pattern = _match(rules, tool_name, action)
            if pattern is not None:
                return PermissionDecision(
                    decision,  # type: ignore[arg-type]
                    f"{tool_name} {action!r} matches {decision} rule {pattern!r}",
                )
        if self.mode == "allow_all":
            return PermissionDecision("allow", "no rule matched; mode allow_all")
        return PermissionDecision("deny", f"{tool_name} {action!r} matches no allow rule")

    async def authorize(self, tool_name: str, args: Mapping[str, Any]) -> PermissionDecision:
        """:meth:`check`, with an escalation resolved through ``on_escalate``; without one,
        the escalation is returned as it is (the call waits for an approver)."""
        action = self.action_of(args)
        decision = self.check(tool_name, action, args)
        if decision.decision != "escalate":
            return decision
        if self.on_escalate is None:
            return PermissionDecision("escalate", decision.reason + "; waiting for approval")
        approved = await call_user(self.on_escalate, tool_name, action, dict(args))
        if approved:
            return PermissionDecision("allow", decision.reason + "; approved by on_escalate")
        return PermissionDecision("deny", decision.reason + "; refused by on_escalate")

    def pre_hook(self) -> HookHandler:
        """A TOOL_PRE handler raising PermissionError on denial (the C3 abort path), and
        ApprovalRequired for an escalation no ``on_escalate`` decides (the call is parked; once
        approved, this hook sees ``payload["approval"]`` and lets it through)."""

        async def permission_pre_hook(payload: dict[str, Any]) -> None:
            context: CallContext = payload["context"]
            decision = await self.authorize(context.function, context.arguments)
            if decision.decision == "escalate":
                if (payload.get("approval") or {}).get("decision") == "approved":
                    return
                raise ApprovalRequired(decision.reason)
            if not decision.allowed:
                raise PolicyDeniedError(f"permission denied: {decision.reason}")

        return permission_pre_hook

    def install(self, branch: Branch) -> HookHandler:
        """Register :meth:`pre_hook` on ``branch``; returns the handler (for ``hooks.off``)."""
        return branch.hooks.on(HookPoint.TOOL_PRE, self.pre_hook())

    def to_pre_hook(self, tool_name: str) -> Callable[..., dict[str, Any]]:
        """A Tool preprocessor for ``tool_name``: runs on the worker, raises PermissionError.

        Escalations are resolved only by a synchronous ``on_escalate`` here; without one they
        are denied (a worker cannot park a call it is running).
        """

        def permission_preprocessor(arguments: dict[str, Any], **_: Any) -> dict[str, Any]:
            action = self.action_of(arguments)
            decision = self.check(tool_name, action, arguments)
            if decision.decision == "escalate" and self.on_escalate is not None:
                approved = self.on_escalate(tool_name, action, dict(arguments))
                if inspect.isawaitable(approved):
                    raise WrongTypeError("to_pre_hook() needs a synchronous on_escalate")
                if approved:
                    return arguments
            if not decision.allowed:
                raise PolicyDeniedError(f"permission denied: {decision.reason}")
            return arguments

        return permission_preprocessor

    def as_gate(self) -> Callable[[ToolInvocation], Any]:
        """A session gate: denial becomes the governance-denied value, not an error; an
        escalation no ``on_escalate`` decides parks the call for approval."""

        async def permission_gate(invocation: ToolInvocation) -> bool | Escalate:
            decision = await self.authorize(invocation.function, invocation.arguments)
            if decision.decision == "escalate":
                return Escalate(decision.reason)
            return decision.allowed

        return permission_gate


def _match(rules: Mapping[str, list[str]], tool_name: str, action: str) -> str | None:
    for key in (tool_name, "*"):
        for pattern in rules.get(key, ()):
            if fnmatch.fnmatchcase(action, pattern):
                return pattern
    return None
