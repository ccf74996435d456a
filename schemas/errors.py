"""Every error toolfleet raises derives from :class:`ToolfleetError`.

Messages name the offending value and say what to do instead.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "ApprovalDeniedError",
    "ApprovalError",
    "ApprovalRequired",
    "ArgumentValidationError",
    "BrokerError",
    "CallLostError",
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
    "ToolfleetError",
    "UnknownToolError",
    "WorkerLostError",
]


class ToolfleetError(Exception):
    """Base class for all toolfleet errors."""

    # The attributes a call's structured error carries (ErrorInfo.fields) for this class:
    # the facts a caller acts on without reading the message (JSON values; None left out).
    info_fields: ClassVar[tuple[str, ...]] = ()


class ConfigurationError(ToolfleetError, ValueError):
    """Raised when a setting or parameter has a value toolfleet cannot use."""


class MalformedRequestError(ToolfleetError, ValueError):
    """Raised when an action request is not an ActionRequest, a model or a dict with
    ``function`` and ``arguments``, nor a provider tool call."""

    # The provider's id of the call, when the malformed request carried one (so its error
    # result can still be paired with it).
    tool_call_id: str | None = None
    # "custom" when it was an OpenAI custom tool call, whose answer has its own item type.
    tool_call_type: str = "function"


class ArgumentValidationError(ToolfleetError, ValueError):
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


class RefusedCallError(ToolfleetError):
    """Raised when a worker refuses a message whose claims do not hold (wrong pool for the
    tool's kind, a reply list outside this fleet's reply keys)."""


class UnknownToolError(ToolfleetError, LookupError):
    """Raised when a call names a tool that is not in the registry."""


class DuplicateToolError(ToolfleetError, ValueError):
    """Raised when a second tool is registered under a name already taken."""


class ToolTimeoutError(ToolfleetError, TimeoutError):
    """Raised when a tool runs past its ``timeout_s`` or its task's time limit."""

    info_fields = ("timeout_s",)

    def __init__(self, message: str = "", *, timeout_s: float | None = None) -> None:
        super().__init__(message)
        # The limit the call missed, in seconds, when one is known.
        self.timeout_s = timeout_s


class WorkerLostError(ToolfleetError):
    """Raised when the worker running a non-idempotent call died before it finished."""


class BrokerError(ToolfleetError, ConnectionError):
    """Raised when the broker cannot be reached to enqueue or collect a call."""


class EmbeddedStartError(ToolfleetError, RuntimeError):
    """Raised when the embedded Redis or a local worker does not start or answer in time."""


class NoWorkerError(ToolfleetError):
    """Raised when no live worker consumes a call's queue within TOOLFLEET_NO_WORKER_TIMEOUT_S."""


class CallLostError(ToolfleetError):
    """Raised when a call's message vanished twice (in no queue, reserved by no worker, not
    started, no record), once before and once after the dispatcher republished it."""


class DispatcherLostError(ToolfleetError):
    """Raised (as a recorded error) for a call whose dispatcher died before enqueueing it."""


class RateLimitedError(ToolfleetError):
    """Raised when a call is over its tool's rate limit or concurrency cap past limit_wait_s."""

    info_fields = ("retry_after_s",)

    def __init__(self, message: str = "", *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        # When a retry may be let through, in seconds; a result carries it as
        # error_info.fields["retry_after_s"], and rebuild_error sets it back.
        self.retry_after_s = retry_after_s


class ApprovalDeniedError(ToolfleetError):
    """Raised (as a recorded error) for a call whose approval was denied or timed out."""


class ApprovalRequired(ToolfleetError):
    """Raised by a TOOL_PRE hook to park the call for approval instead of refusing it."""


class ApprovalError(ToolfleetError, LookupError):
    """Raised when an approve or deny names a call that is not waiting for approval."""


class NoCurrentCallError(ToolfleetError, RuntimeError):
    """Raised when ``current_call()`` is asked for outside a tool body running on a worker."""


class RemoteToolError(ToolfleetError):
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
