"""Lifecycle hooks of a branch's tool calls: TOOL_PRE guards, TOOL_POST/TOOL_ERROR observers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from toolfleet.dispatcher.govern.callbacks import call_user
from toolfleet.dispatcher.govern.emitter import Emitter
from toolfleet.schemas.errors import ConfigurationError, ControlSignal

__all__ = ["HookBus", "HookFailure", "HookHandler", "HookPoint", "StopHook"]

HookHandler = Callable[[dict[str, Any]], "Awaitable[Any] | Any"]


class HookPoint(StrEnum):
    TOOL_PRE = "tool_pre"
    TOOL_POST = "tool_post"
    TOOL_ERROR = "tool_error"


class StopHook(ControlSignal):
    """Raised by a handler to skip the remaining handlers of its point (not the call)."""


@dataclass(frozen=True, slots=True)
class HookFailure:
    """An isolated exception from a TOOL_POST or TOOL_ERROR handler."""

    point: HookPoint
    handler: str
    error: BaseException


class HookBus:
    """Handlers per hook point, run in registration order.

    TOOL_PRE is blocking: handlers run one after another and an exception propagates to
    the caller (which aborts that one call, C3). Every other point isolates failures: they
    are logged and returned, and the next handler still runs.
    """

    def __init__(self) -> None:
        self._handlers: dict[HookPoint, list[HookHandler]] = {p: [] for p in HookPoint}

    def on(self, point: HookPoint | str, handler: HookHandler) -> HookHandler:
        """Register ``handler(payload: dict)`` (sync or async) at ``point``; returns it."""
        self._handlers[_point(point)].append(handler)
        return handler

    def off(self, point: HookPoint | str, handler: HookHandler) -> None:
        """Remove a handler registered with :meth:`on`; a missing one is ignored."""
        handlers = self._handlers[_point(point)]
        if handler in handlers:
            handlers.remove(handler)

    def handlers(self, point: HookPoint | str) -> tuple[HookHandler, ...]:
        return tuple(self._handlers[_point(point)])

    async def emit_pre(self, payload: dict[str, Any]) -> None:
        """Run TOOL_PRE handlers in order; StopHook ends the chain, anything else raises."""
        for handler in self.handlers(HookPoint.TOOL_PRE):
            try:
                await call_user(handler, {"point": HookPoint.TOOL_PRE, **payload})
            except StopHook:
                return

    async def emit(
        self, point: HookPoint | str, payload: dict[str, Any], emitter: Emitter | None = None
    ) -> list[HookFailure]:
        """Run a non-blocking point's handlers through ``emitter`` (which logs each failure
        and records it as a signal when it has a sink); failures are isolated and returned."""
        point = _point(point)
        if point is HookPoint.TOOL_PRE:
            raise ConfigurationError("TOOL_PRE is blocking; use emit_pre() so its errors propagate")
        emitter = emitter or Emitter()
        failures: list[HookFailure] = []
        for handler in self.handlers(point):
            try:
                outcome = await emitter.call(
                    handler,
                    {"point": point, **payload},
                    where=str(point),
                    call_id=payload.get("call_id"),
                    passthrough=(StopHook,),
                )
            except StopHook:
                break  # lionagi's semantics: the chain ends here, and nothing failed
            if outcome.error is not None:
                failures.append(HookFailure(point, outcome.handler, outcome.error))
        return failures


def _point(point: HookPoint | str) -> HookPoint:
    try:
        return HookPoint(point)
    except ValueError:
        raise ConfigurationError(
            f"unknown hook point {point!r}; use one of {[p.value for p in HookPoint]}"
        ) from None
