"""toolfleet's domain models: everything that crosses the broker or is stored."""

from toolfleet.schemas.action import ActionResponseModel, CallParams, ToolInvocation
from toolfleet.schemas.error_info import ErrorInfo, error_record, rebuild_error
from toolfleet.schemas.errors import (
    ArgumentValidationError,
    BrokerError,
    CallLostError,
    ConfigurationError,
    DispatcherLostError,
    DuplicateToolError,
    MalformedRequestError,
    NotJSONError,
    NoWorkerError,
    OversizedArgumentsError,
    RefusedCallError,
    RemoteToolError,
    ToolfleetError,
    ToolTimeoutError,
    UnknownToolError,
    WorkerLostError,
)
from toolfleet.schemas.event import Event
from toolfleet.schemas.execution import MAX_ERRORS, Execution
from toolfleet.schemas.function_calling import (
    REDACTED,
    FunctionCalling,
    normalize_arguments,
    redact,
)
from toolfleet.schemas.messages import (
    ActionRequest,
    ActionRequestContent,
    ActionResponse,
    ActionResponseContent,
    Message,
)
from toolfleet.schemas.provider import (
    RESULT_FORMATS,
    anthropic_tool_result,
    openai_function_call_output,
    openai_tool_message,
    render_results,
    result_text,
)
from toolfleet.schemas.record import EventRecord, not_run_result, shown_arguments
from toolfleet.schemas.serialize import (
    UNSERIALIZABLE,
    describe_exception,
    format_error,
    to_jsonable,
)
from toolfleet.schemas.status import TERMINAL_STATUSES, EventStatus
from toolfleet.schemas.tool import Tool, ToolKind, callable_kind, is_coro_func
from toolfleet.schemas.wire import CallMessage, CallResult

__all__ = [
    "MAX_ERRORS",
    "REDACTED",
    "RESULT_FORMATS",
    "TERMINAL_STATUSES",
    "UNSERIALIZABLE",
    "ActionRequest",
    "ActionRequestContent",
    "ActionResponse",
    "ActionResponseContent",
    "ActionResponseModel",
    "ArgumentValidationError",
    "BrokerError",
    "CallLostError",
    "CallMessage",
    "CallParams",
    "CallResult",
    "ConfigurationError",
    "DispatcherLostError",
    "DuplicateToolError",
    "ErrorInfo",
    "Event",
    "EventRecord",
    "EventStatus",
    "Execution",
    "FunctionCalling",
    "MalformedRequestError",
    "Message",
    "NoWorkerError",
    "NotJSONError",
    "OversizedArgumentsError",
    "RefusedCallError",
    "RemoteToolError",
    "Tool",
    "ToolInvocation",
    "ToolKind",
    "ToolTimeoutError",
    "ToolfleetError",
    "UnknownToolError",
    "WorkerLostError",
    "anthropic_tool_result",
    "callable_kind",
    "describe_exception",
    "error_record",
    "format_error",
    "is_coro_func",
    "normalize_arguments",
    "not_run_result",
    "openai_function_call_output",
    "openai_tool_message",
    "rebuild_error",
    "redact",
    "render_results",
    "result_text",
    "shown_arguments",
    "to_jsonable",
]
