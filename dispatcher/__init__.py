"""The caller's side of toolfleet: Branch.act, governance, hooks, enqueue, collect, history."""

from toolfleet.dispatcher.accept.context import CallContext
from toolfleet.dispatcher.accept.envelope import normalize, tool_calls_in
from toolfleet.dispatcher.branch import Branch
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.approvals import Escalate
from toolfleet.dispatcher.govern.extension import Extension
from toolfleet.dispatcher.govern.hooks import HookBus, HookPoint, StopHook
from toolfleet.dispatcher.govern.permissions import PermissionDecision, PermissionPolicy
from toolfleet.dispatcher.govern.session_signals import (
    CallbackFailed,
    GateDenied,
    HistoryWriteFailed,
)
from toolfleet.dispatcher.session import Session
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.progress import CallProgress
from toolfleet.schemas.provider import render_results

__all__ = [
    "Branch",
    "CallContext",
    "CallProgress",
    "CallbackFailed",
    "ConfigurationError",
    "Escalate",
    "Extension",
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
