"""A registered tool: its callable, its parameters and how it must be run."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.limits import BRANCH_KEY, SESSION_KEY, RateLimit
from toolfleet.schemas.model import ToolfleetModel
from toolfleet.schemas.signature import signature_model

__all__ = ["Tool", "ToolKind", "callable_kind", "is_coro_func", "is_lionagi_tool"]

ToolKind = Literal["sync", "async"]


def is_coro_func(func: Any) -> bool:
    """True when calling ``func`` is declared to return a coroutine.

    Unwraps ``functools.partial`` and recognises objects whose ``__call__`` is
    ``async def``. Classification follows the declaration, never a returned value.
    """
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.iscoroutinefunction(func):
        return True
    if not inspect.isfunction(func) and not inspect.ismethod(func) and callable(func):
        call = getattr(type(func), "__call__", None)  # noqa: B004
        return call is not None and inspect.iscoroutinefunction(call)
    return False


def callable_kind(func: Any) -> ToolKind:
    return "async" if is_coro_func(func) else "sync"


class Tool(ToolfleetModel):
    """A function exposed to the model, plus how toolfleet must execute it."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    func_callable: Callable[..., Any]
    function: str = ""
    request_options: type[BaseModel] | None = None
    strict: bool = False
    preprocessor: Callable[..., Any] | None = None
    preprocessor_kwargs: dict[str, Any] = Field(default_factory=dict)
    postprocessor: Callable[..., Any] | None = None
    postprocessor_kwargs: dict[str, Any] = Field(default_factory=dict)
    kind: ToolKind | None = None
    timeout_s: float | None = None
    secret_args: frozenset[str] = frozenset()
    idempotent: bool = False
    # What the tool does to the world, announced to MCP clients as tool annotations
    # (readOnlyHint, destructiveHint, openWorldHint; idempotent is idempotentHint).
    # None: not declared.
    read_only: bool = False
    destructive: bool | None = None
    open_world: bool | None = None
    # Fleet-wide controls, enforced in Redis by every worker before the tool runs
    # (toolfleet.schemas.limits, toolfleet.workers.limits): calls started per period ("20/s"),
    # calls running at once, and what both count per (an argument's name, "branch" or
    # "session"; None: the whole tool). None: no limit, and nothing paid for one.
    rate_limit: RateLimit | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    limit_key: str | None = None
    # Every call waits, parked in Redis, for someone's approval before it is enqueued
    # (toolfleet.dispatcher.govern.approvals).
    approval: bool = False

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        func = data.get("func_callable")
        if func is None or not callable(func):
            raise ConfigurationError(
                f"func_callable must be a callable, got {func!r}; pass the function to run"
            )
        if not data.get("function"):
            data["function"] = _callable_name(func)
        declared = callable_kind(func)
        kind = data.get("kind")
        if kind is None:
            data["kind"] = declared
        elif kind != declared:
            # kind picks the queue: a sync tool on the asyncio pool would block its loop,
            # and FunctionCalling awaits by declaration anyway (C6).
            raise ConfigurationError(
                f"kind={kind!r} contradicts the callable's declaration ({declared}); "
                f"leave kind unset or declare the callable `async def`"
            )
        secret_args = data.get("secret_args") or ()
        # A bare name is one argument, not the set of its characters (which redacts nothing).
        if isinstance(secret_args, str):
            secret_args = (secret_args,)
        data["secret_args"] = frozenset(secret_args)
        if isinstance(data.get("rate_limit"), str):
            data["rate_limit"] = RateLimit.parse(data["rate_limit"])
        if data.get("read_only") and data.get("destructive"):
            raise ConfigurationError(
                "a tool cannot be both read_only=True and destructive=True; a read-only tool "
                "changes nothing, so drop one of the two"
            )
        return data

    @model_validator(mode="after")
    def _check_limit_key(self) -> Tool:
        key = self.limit_key
        if key is None:
            return self
        if not self.limited:
            raise ConfigurationError(
                f"limit_key={key!r} says what a limit counts per, but {self.function!r} has "
                "no limit; give rate_limit=... or max_concurrency=... too, or drop limit_key"
            )
        parameters = self.required_fields
        if key in (BRANCH_KEY, SESSION_KEY):
            if key in parameters:
                raise ConfigurationError(
                    f"limit_key={key!r} is ambiguous for {self.function!r}: it means the call's "
                    f"own {key}, and the tool also has a parameter named {key!r}; rename the "
                    "parameter"
                )
        elif key not in parameters and not self.accepts_extra_arguments:
            raise ConfigurationError(
                f"limit_key={key!r} is not a parameter of {self.function!r} (parameters: "
                f"{sorted(parameters)}); name one of them, 'branch' or 'session'"
            )
        if key in self.secret_args:
            raise ConfigurationError(
                f"limit_key={key!r} names a secret argument of {self.function!r}; its value "
                "would be shown in Redis keys and errors, so scope the limit by another argument"
            )
        return self

    @property
    def limited(self) -> bool:
        """True when calls of this tool pass a rate limit or concurrency cap before running."""
        return self.rate_limit is not None or self.max_concurrency is not None

    def __hash__(self) -> int:
        # pydantic's field-wise hash of a frozen model fails on the kwargs dicts; a tool is
        # its name and its callable (lionagi keeps tools in sets and dict keys).
        return hash((self.function, id(self.func_callable)))

    @classmethod
    def from_lionagi(cls, lionagi_tool: Any, **overrides: Any) -> Tool:
        """The toolfleet Tool of a lionagi ``Tool``: its callable, name, request model,
        strictness and pre/postprocessors (with their kwargs) carried over."""
        fields: dict[str, Any] = {
            "func_callable": lionagi_tool.func_callable,
            "function": lionagi_tool.function,
            "request_options": getattr(lionagi_tool, "request_options", None),
            "strict": bool(getattr(lionagi_tool, "strict_func_call", False)),
            "preprocessor": getattr(lionagi_tool, "preprocessor", None),
            "preprocessor_kwargs": dict(getattr(lionagi_tool, "preprocessor_kwargs", None) or {}),
            "postprocessor": getattr(lionagi_tool, "postprocessor", None),
            "postprocessor_kwargs": dict(getattr(lionagi_tool, "postprocessor_kwargs", None) or {}),
        }
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**fields)

    @field_validator("timeout_s")
    @classmethod
    def _positive_timeout(cls, timeout_s: float | None) -> float | None:
        # After coercion, so "5" is 5.0 and "soon" is a ValidationError, not a TypeError.
        if timeout_s is not None and not timeout_s > 0:
            raise ConfigurationError(
                f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}"
            )
        return timeout_s

    @functools.cached_property
    def required_fields(self) -> frozenset[str]:
        """Every declared parameter; a strict call must supply exactly these.

        Cached (as are the two below): signatures are read once per tool, not once per call.
        """
        if self.request_options is not None:
            return frozenset(self.request_options.model_fields)
        return frozenset(self._parameters())

    @functools.cached_property
    def minimum_acceptable_fields(self) -> frozenset[str]:
        """Parameters without a default; a non-strict call must supply at least these."""
        if self.request_options is not None:
            return frozenset(
                name for name, f in self.request_options.model_fields.items() if f.is_required()
            )
        return frozenset(
            name for name, p in self._parameters().items() if p.default is inspect.Parameter.empty
        )

    @functools.cached_property
    def arguments_model(self) -> type[BaseModel]:
        """The model of this tool's arguments: its request model, else one built from the
        callable's signature. The specs publish its JSON Schema; every call is validated
        against it (:func:`toolfleet.schemas.function_calling.normalize_arguments`)."""
        if self.request_options is not None:
            return self.request_options
        return signature_model(
            self.function, self.func_callable, self._parameters(), self.accepts_extra_arguments
        )

    @functools.cached_property
    def typed_arguments(self) -> frozenset[str]:
        """The arguments whose declared type is more than ``Any``: validation may convert
        their values (pydantic's lax mode)."""
        return frozenset(
            name for name, f in self.arguments_model.model_fields.items() if f.annotation is not Any
        )

    @functools.cached_property
    def accepts_extra_arguments(self) -> bool:
        """True when the callable takes ``**kwargs``, so unknown keys are not an error."""
        if self.request_options is not None:
            return self.request_options.model_config.get("extra") == "allow"
        try:
            params = inspect.signature(self.func_callable).parameters.values()
        except (TypeError, ValueError):
            return True
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)

    def _parameters(self) -> dict[str, inspect.Parameter]:
        try:
            params = inspect.signature(self.func_callable).parameters
        except (TypeError, ValueError):
            return {}
        return {
            name: p
            for name, p in params.items()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        }


def is_lionagi_tool(obj: Any) -> bool:
    """True for a lionagi ``Tool`` (duck-typed on its module: lionagi stays optional)."""
    module = type(obj).__module__ or ""
    return module.startswith("lionagi.") and hasattr(obj, "func_callable")


def _callable_name(func: Any) -> str:
    while isinstance(func, functools.partial):
        func = func.func
    name = getattr(func, "__name__", None) or type(func).__name__
    return str(name)
