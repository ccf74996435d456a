"""The caller's side of toolfleet: Branch.act, governance, hooks, enqueue, collect, history."""

from dispatcher.branch import Branch
from dispatcher.context import CallContext
from dispatcher.envelope import normalize, tool_calls_in
from dispatcher.fleet import Fleet
from dispatcher.hooks import HookBus, HookPoint, StopHook
from dispatcher.permissions import PermissionDecision, PermissionPolicy
from dispatcher.session import Session
from dispatcher.signals import CallbackFailed, GateDenied, HistoryWriteFailed
from schemas.errors import ConfigurationError
from schemas.provider import render_results

__all__ = [
    "Branch",
    "CallContext",
    "CallbackFailed",
    "ConfigurationError",
    "Fleet",
    "GateDenied",
    "HistoryWriteFailed",
    "HookBus",
    "HookPoint",
    "PermissionDecision",
    "PermissionPolicy",
    "Session",
    "StopHook",
    "normalize",
    "render_results",
    "tool_calls_in",
]
