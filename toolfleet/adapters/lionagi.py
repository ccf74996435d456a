"""lionagi on the fleet: ``on_fleet(branch)`` and a lionagi Branch's tool
calls run on toolfleet's workers.

``pip install "toolfleet[lionagi]"``. lionagi's ``Branch.act()``, ``operate(actions=True)``,
``ReAct`` and LNDL action calls all reach the module function
``lionagi.operations.act.act.act(branch, requests, action_param)``; ``on_fleet`` wraps that
function once (branches not put on a fleet keep lionagi's own path) and routes a fleet
branch's requests through one toolfleet ``Branch.act`` batch. Each unit toolfleet writes is
mirrored, as it is written, into lionagi's own MessageManager: the ActionRequest (the one the
caller gave, when it was a lionagi ActionRequest) and its linked ActionResponse, in input
order, a failure's text in ``ActionResponseContent.error``.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from toolfleet.dispatcher.accept.context import CallContext
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.approvals import Escalate
from toolfleet.dispatcher.govern.hooks import HookPoint
from toolfleet.dispatcher.govern.session import Session
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.error_info import rebuild_error
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.messages import ActionRequest, ActionResponse, Message
from toolfleet.schemas.status import EventStatus

__all__ = ["FleetBridge", "on_fleet"]

DENIED = "denied by governance gate"
_ACT_MODULE = "lionagi.operations.act.act"
# lionagi AlcallParams field -> toolfleet CallParams field (the same knobs, toolfleet units).
_CALL_PARAMS = {
    "retry_attempts": "retry_attempts",
    "retry_initial_delay": "retry_initial_delay_s",
    "retry_backoff": "retry_backoff",
    "retry_timeout": "timeout_s",
    "max_concurrent": "max_in_flight",
    "throttle_period": "throttle_period_s",
}

_bridges: weakref.WeakKeyDictionary[Any, FleetBridge] = weakref.WeakKeyDictionary()


def on_fleet(
    branch: Any,
    *,
    fleet: Fleet | None = None,
    session: Session | None = None,
    register_tools: bool = True,
) -> Any:
    """Put the lionagi ``branch`` on the fleet and return it (the same object).

    From now on its tool calls run on ``fleet`` (default: the process-default
    ``Fleet.from_env()``) as one toolfleet batch per act; toolfleet's history of them is kept
    in Redis under the lionagi branch's id (``toolfleet history <branch.id>``). ``session``
    adds toolfleet gates and observers; lionagi's own gate (``branch.authorize``) is asked
    too, and a denial is the call's result as in lionagi. With ``register_tools`` the fleet's
    tools the branch does not know yet are registered with it, so ``operate()`` shows their
    specs to the model. Calling it again rebinds the branch to the new fleet.
    """
    lionagi_branch_type = _lionagi_branch_type()
    if not isinstance(branch, lionagi_branch_type):
        raise ConfigurationError(
            f"on_fleet() takes a lionagi Branch, got {type(branch).__name__}; for toolfleet's "
            "own branches use dispatcher.Branch(fleet=...)"
        )
    _install()
    bridge = FleetBridge(branch, fleet=fleet, session=session)
    _bridges[branch] = bridge
    if register_tools:
        bridge.register_fleet_tools()
    return branch


def bridge_of(branch: Any) -> FleetBridge | None:
    """The bridge of a lionagi branch put on a fleet, else None."""
    return _bridges.get(branch)


class FleetBridge:
    """One lionagi branch's toolfleet branch, and the mirror of its history into lionagi."""

    def __init__(
        self, lionagi_branch: Any, *, fleet: Fleet | None, session: Session | None
    ) -> None:
        self.lionagi_branch = lionagi_branch
        self.branch = _GatedBranch(lionagi_branch, session, fleet=fleet, id=str(lionagi_branch.id))
        self.branch.on_message(self._mirror)
        # lionagi's TOOL_PRE handlers are guards (a raise stops the call): they must stay in
        # force on the fleet, so each toolfleet hook point fires lionagi's as well.
        self.branch.hooks.on(HookPoint.TOOL_PRE, self._tool_pre)
        self.branch.hooks.on(HookPoint.TOOL_POST, self._tool_post)
        self.branch.hooks.on(HookPoint.TOOL_ERROR, self._tool_error)
        # Per batch: the caller's lionagi ActionRequests by tool_call_id, and the lionagi
        # request of each call whose response is still to be written, by call_id.
        self._given: dict[str, Any] = {}
        self._open: dict[str, Any] = {}

    def register_fleet_tools(self) -> None:
        from lionagi.protocols.action.tool import Tool as LionagiTool

        known = set(self.lionagi_branch.acts.registry)
        specs = {s["function"]["name"]: s for s in self.branch.fleet.registry.specs("openai")}
        for name, spec in specs.items():
            if name in known:
                continue
            tool = self.branch.fleet.registry.get(name)
            # Never called here: the bridge sends every call to the fleet. The schema is
            # toolfleet's, so the model sees what the workers validate.
            self.lionagi_branch.register_tools(
                LionagiTool(func_callable=tool.func_callable, tool_schema=spec)
            )

    async def act(self, requests: Any, action_param: Any) -> list[Any]:
        """Run lionagi's ``requests`` as one toolfleet batch; lionagi's response models."""
        from lionagi.operations.fields import ActionResponseModel as LionagiResponseModel

        items = list(requests) if isinstance(requests, list) else [requests]
        if not items:
            return []
        self._given = {str(r.id): r for r in items if _is_lionagi_request(r)}
        self._open = {}
        try:
            results = await self.branch.act(
                items,
                strategy=getattr(action_param, "strategy", "concurrent"),
                verbose_action=bool(getattr(action_param, "verbose_action", False)),
                suppress_errors=bool(getattr(action_param, "suppress_errors", True)),
                call_params=_call_params(getattr(action_param, "action_call_params", None)),
            )
        finally:
            self._given, self._open = {}, {}
        return [
            LionagiResponseModel(
                function=r.function,
                arguments=r.arguments,
                # lionagi's shapes: the output, the denial dict (a gate's, or an approver's:
                # SKIPPED, never run), or None for a failure (whose text is in the history's
                # ActionResponseContent.error).
                output=r.output
                if r.error is None or r.error == DENIED or r.status is EventStatus.SKIPPED
                else None,
            )
            for r in results
        ]

    async def _emit(self, point: str, payload: dict[str, Any], **fields: Any) -> None:
        """Emit lionagi's hook ``point`` (a HookPoint name) for the call of ``payload`` on
        the lionagi branch's hook bus, if it has one."""
        bus = self.lionagi_branch._hooks
        if bus is None:
            return
        from lionagi.hooks.bus import HookPoint as LionagiPoint

        await bus.emit(
            LionagiPoint[point],
            call_id=payload["call_id"],
            tool_name=payload["tool_name"],
            **fields,
        )

    async def _tool_pre(self, payload: dict[str, Any]) -> None:
        # blocking_emit: a guard's exception propagates, and toolfleet's TOOL_PRE rule
        # (C3) then aborts just this call, as lionagi does.
        await self._emit("TOOL_PRE", payload, args_summary=str(payload["arguments"])[:200])

    async def _tool_post(self, payload: dict[str, Any]) -> None:
        if payload.get("error") is not None:
            # toolfleet's TOOL_POST follows every run; lionagi's TOOL_ERROR a failed one,
            # with the exception rebuilt from the call's structured error.
            info = payload.get("error_info")
            await self._emit(
                "TOOL_ERROR",
                payload,
                error=rebuild_error(info) if info is not None else RuntimeError(payload["error"]),
                duration=payload.get("duration"),
            )
            return
        await self._emit(
            "TOOL_POST",
            payload,
            result_summary=str(payload.get("response"))[:200],
            duration=payload.get("duration"),
        )

    async def _tool_error(self, payload: dict[str, Any]) -> None:
        await self._emit(
            "TOOL_ERROR", payload, error=payload.get("error"), duration=payload.get("duration")
        )

    async def _mirror(self, message: Message) -> None:
        msgs = self.lionagi_branch.msgs
        me = self.lionagi_branch.id
        if isinstance(message, ActionRequest):
            content = message.content
            request = self._given.pop(content.tool_call_id or "", None)
            if request is None:
                request = msgs.create_action_request(
                    function=content.function, arguments=content.arguments, sender=me, recipient=me
                )
            else:
                # As toolfleet does with its own given request: history holds what was
                # recorded (secret values redacted).
                request.content.arguments = dict(content.arguments)
            self._open[content.call_id or message.id] = request
            if request not in self.lionagi_branch.messages:
                await msgs.a_add_message(action_request=request)
            return
        if isinstance(message, ActionResponse):
            answer = message.content
            request = self._open.pop(answer.call_id or "", None)
            if request is None:
                return  # its request was not mirrored (the bridge was rebound mid-batch)
            output = answer.output
            if answer.error is not None and answer.error != DENIED:
                output = {
                    "error": answer.error,
                    "function": answer.function,
                    "arguments": answer.arguments,
                }
            response = msgs.create_action_response(action_request=request, action_output=output)
            response.content.error = answer.error
            await msgs.a_add_message(
                action_request=request, action_output=output, action_response=response
            )


class _GatedBranch(Branch):
    """A toolfleet branch that also asks the lionagi branch's own gate."""

    def __init__(self, lionagi_branch: Any, session: Session | None, **kwargs: Any) -> None:
        super().__init__(session, **kwargs)
        self._lionagi_branch = lionagi_branch

    async def authorize(self, ctx: CallContext) -> str | Escalate | None:
        reason = await super().authorize(ctx)
        if reason is not None:
            return reason
        from lionagi.session.control import ToolInvocation

        invocation = ToolInvocation(
            function=ctx.function, arguments=ctx.public_arguments, branch_id=self.id
        )
        return None if await self._lionagi_branch.authorize(invocation) else DENIED


def _call_params(params: Any) -> CallParams:
    """toolfleet CallParams from lionagi's AlcallParams (unset fields keep toolfleet's)."""
    values: dict[str, Any] = {"output_dropna": False}
    for theirs, ours in _CALL_PARAMS.items():
        value = getattr(params, theirs, None) if params is not None else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            values[ours] = value
    if "max_in_flight" in values:
        values["max_in_flight"] = int(values["max_in_flight"])
    return CallParams(**values)


def _is_lionagi_request(value: Any) -> bool:
    cls = type(value)
    return (cls.__module__ or "").startswith("lionagi.") and cls.__name__ == "ActionRequest"


def _lionagi_branch_type() -> type:
    try:
        from lionagi.session.branch import Branch as LionagiBranch
    except ImportError as exc:
        raise ConfigurationError(
            f"lionagi is not installed ({exc}); pip install 'toolfleet[lionagi]'"
        ) from exc
    return LionagiBranch


def _install() -> None:
    """Wrap lionagi's act() once: branches on a fleet go to their bridge, others to lionagi."""
    module: Any = importlib.import_module(_ACT_MODULE)
    if getattr(module.act, "_toolfleet_bridge", False):
        return
    original: Callable[..., Awaitable[Any]] = module.act

    async def act(branch: Any, action_request: Any, action_param: Any) -> Any:
        bridge = _bridges.get(branch)
        if bridge is None:
            return await original(branch, action_request, action_param)
        return await bridge.act(action_request, action_param)

    act._toolfleet_bridge = True  # type: ignore[attr-defined]
    act.__doc__ = original.__doc__
    module.act = act
