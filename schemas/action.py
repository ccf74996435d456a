"""What a branch action takes and returns: governance proposals, batch controls, results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from toolfleet.schemas.approval import DEFAULT_APPROVAL_TIMEOUT_S
from toolfleet.schemas.error_info import ErrorInfo
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.limits import DEFAULT_LIMIT_WAIT_S
from toolfleet.schemas.model import ToolfleetModel
from toolfleet.schemas.provider import (
    anthropic_tool_result,
    openai_responses_output,
    openai_tool_message,
)
from toolfleet.schemas.status import EventStatus

if TYPE_CHECKING:
    from anthropic.types import ToolResultBlockParam
    from openai.types.chat import ChatCompletionToolMessageParam
    from openai.types.responses import ResponseCustomToolCallOutputParam
    from openai.types.responses.response_input_param import FunctionCallOutput

__all__ = ["ActionResponseModel", "CallParams", "ToolInvocation"]


@dataclass(frozen=True, slots=True)
class ToolInvocation:
    """The proposal a session gate authorizes: normalized arguments, as the tool will see them."""

    function: str
    arguments: dict[str, Any] = field(default_factory=dict)
    branch_id: str | None = None


class ActionResponseModel(ToolfleetModel):
    """The immediate result of one call, as returned by ``Branch.act()``."""

    function: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)
    output: Any = None
    status: EventStatus = EventStatus.COMPLETED
    error: str | None = None
    call_id: str | None = None
    # The model's id of the call (OpenAI tool_call id / call_id, Anthropic tool_use id), or
    # toolfleet's call_id when the model gave none: what the provider-shaped results carry.
    tool_call_id: str | None = None
    # What the model called: "custom" for an OpenAI custom tool call (free-form text input),
    # answered in the Responses API by a custom_tool_call_output item; else "function".
    tool_call_type: Literal["function", "custom"] = "function"
    # The error as structure (type, module, message, fields): what ``error`` says as text,
    # for code to read (toolfleet.schemas.error_info). None when the call did not fail, and
    # for a gate's denial, which is not an error (D2).
    error_info: ErrorInfo | None = None

    def model_post_init(self, context: Any, /) -> None:
        # To save memory, a result with every field given shares one set of field names
        # instead of its own (about 0.7 KB per result, the biggest part of a 100,000-call
        # act()'s return value). Safe to share: setting a field adds a name already in it.
        # Every field but tool_call_type and error_info counts as every field: their defaults
        # are what such a result (any call but a custom one; one built before error_info
        # existed, or without an error) would be given.
        fields_set = self.__pydantic_fields_set__
        if len(fields_set) >= _FEWEST_SHARED and fields_set in _SHARED_WHEN:
            object.__setattr__(self, "__pydantic_fields_set__", _ALL_RESULT_FIELDS)

    @property
    def success(self) -> bool:
        return self.error is None

    def to_openai(self) -> ChatCompletionToolMessageParam:
        """The OpenAI Chat Completions ``{"role": "tool", ...}`` message for this call."""
        return openai_tool_message(self)

    def to_openai_responses(self) -> FunctionCallOutput | ResponseCustomToolCallOutputParam:
        """The OpenAI Responses ``function_call_output`` item for this call
        (``custom_tool_call_output`` for a custom tool call)."""
        return openai_responses_output(self)

    def to_anthropic(self) -> ToolResultBlockParam:
        """The Anthropic ``tool_result`` block (``is_error`` unless COMPLETED) for this call."""
        return anthropic_tool_result(self)


class CallParams(ToolfleetModel):
    """Batch controls (the ADR's AlcallParams). Retries re-run FAILED attempts only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    retry_attempts: int = Field(default=0, ge=0)
    retry_initial_delay_s: float = Field(default=0.0, ge=0)
    retry_backoff: float = Field(default=1.0, ge=1.0)
    timeout_s: float | None = None
    deadline_s: float | None = None
    # C8: calls of this act() in flight at once; None: settings.max_in_flight (256). Its old
    # name, max_concurrent (ADR-0012 D4's and lionagi's), is accepted as an alias.
    max_in_flight: int | None = None
    throttle_period_s: float | None = None
    return_exceptions: bool = False
    output_dropna: bool = True
    # Opt-in for trivial tools: up to this many calls per Celery message (each call keeps its
    # own record and response; Flower shows one task per message). None: one per message.
    # "auto": the dispatcher batches calls of one tool when many are ready at once (a flood)
    # and sends a lone call as its own message (toolfleet.dispatcher.send.publisher.auto_plan).
    bundle_size: int | Literal["auto"] | None = None
    # How long a call over its tool's rate limit or concurrency cap may wait on the worker
    # (holding its worker slot) before it ends FAILED RateLimitedError; 0: never wait.
    limit_wait_s: float = Field(default=DEFAULT_LIMIT_WAIT_S, ge=0)
    # How long a call parked for approval waits for a decision (never past the batch's
    # deadline_s) before it ends denied; it holds no worker slot while it waits.
    approval_timeout_s: float = Field(default=DEFAULT_APPROVAL_TIMEOUT_S, gt=0)

    @field_validator("timeout_s", "deadline_s", "throttle_period_s")
    @classmethod
    def _positive_seconds(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise ConfigurationError(f"must be a positive number of seconds or None, got {value!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _old_window_name(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "max_concurrent" not in data:
            return data
        data = dict(data)
        old = data.pop("max_concurrent")
        if data.get("max_in_flight", old) != old:
            raise ConfigurationError(
                f"max_concurrent={old!r} and max_in_flight={data['max_in_flight']!r} name the "
                "same window; pass max_in_flight only"
            )
        # ADR-0012 D4's (and lionagi's) name: kept as an alias, not deprecated, so a caller
        # written against the ADR's controls keeps working without a warning.
        data["max_in_flight"] = old
        return data

    @property
    def max_concurrent(self) -> int | None:
        """ADR-0012 D4's name of :attr:`max_in_flight`, kept as an alias."""
        return self.max_in_flight

    @field_validator("max_in_flight", "bundle_size")
    @classmethod
    def _positive_count(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 1:
            raise ConfigurationError(
                f"must be at least 1 or None for the default window, got {value!r}"
            )
        return value


# Every field name of ActionResponseModel; shared by the results that set them all.
_ALL_RESULT_FIELDS: set[str] = set(ActionResponseModel.model_fields)
# The sets that count as every field: all of them, less any of the defaulted ones.
_SHARED_WHEN = (
    _ALL_RESULT_FIELDS,
    frozenset(_ALL_RESULT_FIELDS - {"tool_call_type"}),
    frozenset(_ALL_RESULT_FIELDS - {"error_info"}),
    frozenset(_ALL_RESULT_FIELDS - {"tool_call_type", "error_info"}),
)
_FEWEST_SHARED = len(_ALL_RESULT_FIELDS) - 2
