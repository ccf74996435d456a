"""Every error toolfleet raises derives from :class:`ToolfleetError`, in five families:

- :class:`RequestError` — a request was bad (its shape, its tool, its arguments);
- :class:`CallError` — a call was lost or failed (timeout, lost worker, broker, rate limit);
- :class:`ApprovalError` — approvals and permission decisions;
- :class:`SetupError` — configuration, the program's set-up, a model given bad values;
- :class:`ControlSignal` — raised on purpose to steer toolfleet (``StopHook``,
  ``ApprovalRequired``), never a failure.

Where toolfleet used to raise a builtin, its error also subclasses that builtin, so existing
``except`` clauses keep working: a :class:`ConfigurationError` is a ``ValueError``, a
:class:`UsageError` a ``RuntimeError``, :class:`PolicyDeniedError` and :class:`WrongTypeError`
are a ``PermissionError`` and a ``TypeError`` by those very names (the text a model reads is
unchanged), and :class:`ModelValidationError` is pydantic's ``ValidationError``.
``tests/unit/test_error_families.py`` walks the package's raise statements and models to keep
this true.

Messages name the offending value and say what to do instead. A call's error also travels
as data (:mod:`toolfleet.schemas.error_info`): ``info_fields`` names what it carries.
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

from pydantic import ValidationError

__all__ = [
    "ApprovalDeniedError",
    "ApprovalError",
    "ApprovalNotWaitingError",
    "ApprovalRequired",
    "ArgumentValidationError",
    "BrokerError",
    "CallError",
    "CallLostError",
    "ConfigurationError",
    "ControlSignal",
    "DispatcherLostError",
    "DuplicateToolError",
    "EmbeddedStartError",
    "InternalError",
    "MalformedRequestError",
    "ModelValidationError",
    "NoCurrentCallError",
    "NoWorkerError",
    "NotJSONError",
    "OversizedArgumentsError",
    "PermissionError",
    "PolicyDeniedError",
    "RateLimitedError",
    "RefusedCallError",
    "RemoteToolError",
    "RequestError",
    "SetupError",
    "ToolInterruptedError",
    "ToolTimeoutError",
    "ToolfleetError",
    "TypeError",
    "UnknownToolError",
    "UsageError",
    "WorkerLostError",
    "WrongTypeError",
]


class ToolfleetError(Exception):
    """Base class for all toolfleet errors."""

    # The attributes a call's structured error carries (ErrorInfo.fields) for this class:
    # the facts a caller acts on without reading the message (JSON values; None left out).
    info_fields: ClassVar[tuple[str, ...]] = ()


# -- the families ---------------------------------------------------------------------------


class RequestError(ToolfleetError):
    """Raised when a request was bad: its shape, the tool it names or its arguments."""


class CallError(ToolfleetError):
    """Raised when a call was lost or failed: it ran out of time, its worker, dispatcher or
    broker was lost, it was over a limit, or its tool raised."""


class ApprovalError(ToolfleetError):
    """Raised for approvals and permission decisions: a call refused, parked or not waiting."""


class SetupError(ToolfleetError):
    """Raised when toolfleet is set up or used wrongly: a setting, a parameter, a model's
    values, a registry, the embedded fleet, an API called where it cannot work."""


class ControlSignal(ToolfleetError):
    """Raised on purpose to steer toolfleet (end a hook chain, park a call), never a failure."""


class InternalError(ToolfleetError, RuntimeError):
    """Raised when toolfleet finds its own state broken (a bug in toolfleet: report it)."""


# -- a request was bad ----------------------------------------------------------------------


class MalformedRequestError(RequestError, ValueError):
    """Raised when an action request is not an ActionRequest, a model or a dict with
    ``function`` and ``arguments``, nor a provider tool call."""

    # The provider's id of the call, when the malformed request carried one (so its error
    # result can still be paired with it).
    tool_call_id: str | None = None
    # "custom" when it was an OpenAI custom tool call, whose answer has its own item type.
    tool_call_type: str = "function"


class ArgumentValidationError(RequestError, ValueError):
    """Raised when a call's arguments do not fit the tool's declared parameters."""

    info_fields = ("argument",)

    def __init__(self, message: str = "", *, argument: str | None = None) -> None:
        super().__init__(message)
        # The (first) offending argument's name, when one argument is at fault.
        self.argument = argument


class NotJSONError(ArgumentValidationError):
    """Raised when a call's arguments cannot cross the broker as JSON."""


class OversizedArgumentsError(ArgumentValidationError):
    """Raised when a call's serialized arguments exceed the configured size limit."""


class RefusedCallError(RequestError):
    """Raised when a worker refuses a message whose claims do not hold (wrong pool for the
    tool's kind, a reply list outside this fleet's reply keys)."""


class UnknownToolError(RequestError, LookupError):
    """Raised when a call names a tool that is not in the registry."""


# -- a call was lost or failed --------------------------------------------------------------


class ToolTimeoutError(CallError, TimeoutError):
    """Raised when a tool runs past its ``timeout_s`` or its task's time limit."""

    info_fields = ("timeout_s",)

    def __init__(self, message: str = "", *, timeout_s: float | None = None) -> None:
        super().__init__(message)
        # The limit the call missed, in seconds, when one is known.
        self.timeout_s = timeout_s


class WorkerLostError(CallError):
    """Raised when the worker running a non-idempotent call died before it finished."""


class BrokerError(CallError, ConnectionError):
    """Raised when the broker cannot be reached to enqueue or collect a call."""


class NoWorkerError(CallError):
    """Raised when no live worker consumes a call's queue within TOOLFLEET_NO_WORKER_TIMEOUT_S."""


class CallLostError(CallError):
    """Raised when a call's message vanished twice (in no queue, reserved by no worker, not
    started, no record), once before and once after the dispatcher republished it."""


class DispatcherLostError(CallError):
    """Raised (as a recorded error) for a call whose dispatcher died before enqueueing it."""


class RateLimitedError(CallError):
    """Raised when a call is over its tool's rate limit or concurrency cap past limit_wait_s."""

    info_fields = ("retry_after_s",)

    def __init__(self, message: str = "", *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        # When a retry may be let through, in seconds; a result carries it as
        # error_info.fields["retry_after_s"], and rebuild_error sets it back.
        self.retry_after_s = retry_after_s


class ToolInterruptedError(CallError):
    """Raised on a worker when a LangGraph tool calls ``interrupt()`` with no resume value
    left for it: the call stops there, its record saying at which ``interrupt()`` (``index``,
    from 0) and with which ``value``, for ``FleetToolNode`` to pause the graph with."""

    info_fields = ("index", "value")

    def __init__(self, message: str = "", *, index: int | None = None, value: Any = None) -> None:
        super().__init__(message)
        # The interrupt's place among the tool run's interrupt() calls, and what it asked.
        self.index = index
        self.value = value


class RemoteToolError(CallError):
    """Raised in the caller's process for a recorded error whose class cannot be rebuilt
    there (``toolfleet.rebuild_error``): it names the original type, module and fields."""

    def __init__(
        self,
        message: str = "",
        *,
        type_name: str = "Exception",
        module: str = "",
        fields: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.module = module
        self.fields = dict(fields or {})

    def __repr__(self) -> str:
        where = f"{self.module}." if self.module else ""
        return f"RemoteToolError({where}{self.type_name}: {self.args[0] if self.args else ''!r})"


# -- approvals and permissions --------------------------------------------------------------


class ApprovalDeniedError(ApprovalError):
    """Raised (as a recorded error) for a call whose approval was denied or timed out."""


class ApprovalNotWaitingError(ApprovalError, LookupError):
    """Raised when an approve or deny names a call that is not waiting for approval."""


class ApprovalRequired(ApprovalError, ControlSignal):
    """Raised by a TOOL_PRE hook to park the call for approval instead of refusing it."""


class PermissionError(ApprovalError, builtins.PermissionError):
    """Raised by a PermissionPolicy's TOOL_PRE hook or tool preprocessor for a call its
    rules deny (importable as ``PolicyDeniedError``)."""

    # Named as the builtin it replaces, so the error text a model reads ("PermissionError:
    # permission denied: ...") is unchanged; its module tells the two apart (ErrorInfo).


PolicyDeniedError = PermissionError


# -- set-up and use -------------------------------------------------------------------------


class ConfigurationError(SetupError, ValueError):
    """Raised when a setting or parameter has a value toolfleet cannot use."""


class TypeError(SetupError, builtins.TypeError):
    """Raised when a value has a type toolfleet cannot use: a tool declared sync that
    returned an awaitable, a progress report that is not a number, a sync-only callback
    given an async one (importable as ``WrongTypeError``)."""

    # Named as the builtin it replaces, so a call's recorded error ("TypeError: tool ...")
    # reads as it always did; its module tells the two apart (ErrorInfo).


WrongTypeError = TypeError


class ModelValidationError(ValidationError, SetupError):
    """Raised when a toolfleet model (settings, call parameters, a tool's declaration, a
    message or record) is given values it cannot hold; pydantic's ValidationError too."""


class DuplicateToolError(SetupError, ValueError):
    """Raised when a second tool is registered under a name already taken."""


class EmbeddedStartError(SetupError, RuntimeError):
    """Raised when the embedded Redis or a local worker does not start or answer in time."""


class UsageError(SetupError, RuntimeError):
    """Raised when a toolfleet API is called where it cannot work (``act_sync`` inside a
    running event loop, ``current_call()`` outside a tool body)."""


class NoCurrentCallError(UsageError):
    """Raised when ``current_call()`` is asked for outside a tool body running on a worker."""
