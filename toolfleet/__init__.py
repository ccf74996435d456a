"""toolfleet: run the tool calls of AI-agent conversations on a fleet of Celery workers.

This module is the public face. Everything a program needs is importable from here::

    from toolfleet import tool, Branch, Fleet, CallParams

The names resolve on first use, so a worker process (``toolfleet worker``) that only needs
``tool`` never imports the dispatcher, and ``import toolfleet`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolfleet.dispatcher import (
        Branch,
        CallbackFailed,
        CallContext,
        CallProgress,
        Escalate,
        Extension,
        Fleet,
        GateDenied,
        HistoryWriteFailed,
        HookBus,
        HookPoint,
        PermissionDecision,
        PermissionPolicy,
        Session,
        StopHook,
        tool_calls_in,
    )
    from toolfleet.schemas.action import ActionResponseModel, CallParams, ToolInvocation
    from toolfleet.schemas.approval import ApprovalRequest
    from toolfleet.schemas.error_info import ErrorInfo, rebuild_error
    from toolfleet.schemas.errors import (
        ApprovalDeniedError,
        ApprovalError,
        ApprovalNotWaitingError,
        ApprovalRequired,
        ArgumentValidationError,
        BrokerError,
        CallError,
        CallLostError,
        ConfigurationError,
        ControlSignal,
        DispatcherLostError,
        DuplicateToolError,
        EmbeddedStartError,
        InternalError,
        MalformedRequestError,
        ModelValidationError,
        NoCurrentCallError,
        NotJSONError,
        NoWorkerError,
        OversizedArgumentsError,
        PolicyDeniedError,
        RateLimitedError,
        RefusedCallError,
        RemoteToolError,
        RequestError,
        SetupError,
        ToolfleetError,
        ToolTimeoutError,
        UnknownToolError,
        UsageError,
        WorkerLostError,
        WrongTypeError,
    )
    from toolfleet.schemas.provider import render_results
    from toolfleet.schemas.record import EventRecord
    from toolfleet.schemas.settings import Settings
    from toolfleet.schemas.status import EventStatus
    from toolfleet.workers.current_call import CurrentCall, current_call
    from toolfleet.workers.registry import Registry, registry, tool

# Where each public name lives; resolved by __getattr__ below.
_HOMES: dict[str, str] = {
    **dict.fromkeys(
        (
            "Branch",
            "CallContext",
            "CallProgress",
            "CallbackFailed",
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
            "tool_calls_in",
        ),
        "toolfleet.dispatcher",
    ),
    **dict.fromkeys(
        ("ActionResponseModel", "CallParams", "ToolInvocation"), "toolfleet.schemas.action"
    ),
    **dict.fromkeys(
        (
            "ArgumentValidationError",
            "BrokerError",
            "CallLostError",
            "ApprovalDeniedError",
            "ApprovalError",
            "ApprovalRequired",
            "ConfigurationError",
            "DispatcherLostError",
            "DuplicateToolError",
            "EmbeddedStartError",
            "MalformedRequestError",
            "NoCurrentCallError",
            "NoWorkerError",
            "NotJSONError",
            "OversizedArgumentsError",
            "RateLimitedError",
            "RefusedCallError",
            "RemoteToolError",
            "ToolTimeoutError",
            "ApprovalNotWaitingError",
            "CallError",
            "ControlSignal",
            "InternalError",
            "ModelValidationError",
            "PolicyDeniedError",
            "RequestError",
            "SetupError",
            "UsageError",
            "WrongTypeError",
            "ToolfleetError",
            "UnknownToolError",
            "WorkerLostError",
        ),
        "toolfleet.schemas.errors",
    ),
    "ApprovalRequest": "toolfleet.schemas.approval",
    **dict.fromkeys(("ErrorInfo", "rebuild_error"), "toolfleet.schemas.error_info"),
    "render_results": "toolfleet.schemas.provider",
    "EventRecord": "toolfleet.schemas.record",
    "Settings": "toolfleet.schemas.settings",
    "EventStatus": "toolfleet.schemas.status",
    **dict.fromkeys(("Registry", "registry", "tool"), "toolfleet.workers.registry"),
    **dict.fromkeys(("CurrentCall", "current_call"), "toolfleet.workers.current_call"),
}

__all__ = [
    "ActionResponseModel",
    "ApprovalDeniedError",
    "ApprovalError",
    "ApprovalNotWaitingError",
    "ApprovalRequest",
    "ApprovalRequired",
    "ArgumentValidationError",
    "Branch",
    "BrokerError",
    "CallContext",
    "CallError",
    "CallLostError",
    "CallParams",
    "CallProgress",
    "CallbackFailed",
    "ConfigurationError",
    "ControlSignal",
    "CurrentCall",
    "DispatcherLostError",
    "DuplicateToolError",
    "EmbeddedStartError",
    "ErrorInfo",
    "Escalate",
    "EventRecord",
    "EventStatus",
    "Extension",
    "Fleet",
    "GateDenied",
    "HistoryWriteFailed",
    "HookBus",
    "HookPoint",
    "InternalError",
    "MalformedRequestError",
    "ModelValidationError",
    "NoCurrentCallError",
    "NoWorkerError",
    "NotJSONError",
    "OversizedArgumentsError",
    "PermissionDecision",
    "PermissionPolicy",
    "PolicyDeniedError",
    "RateLimitedError",
    "RefusedCallError",
    "Registry",
    "RemoteToolError",
    "RequestError",
    "Session",
    "Settings",
    "SetupError",
    "StopHook",
    "ToolInvocation",
    "ToolTimeoutError",
    "ToolfleetError",
    "UnknownToolError",
    "UsageError",
    "WorkerLostError",
    "WrongTypeError",
    "current_call",
    "rebuild_error",
    "registry",
    "render_results",
    "tool",
    "tool_calls_in",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'toolfleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
