"""One tool call as a failure-capturing event (ADR-0012 D1)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from toolfleet.schemas.contract import safe_repr
from toolfleet.schemas.errors import ArgumentValidationError, ToolTimeoutError, WrongTypeError
from toolfleet.schemas.event import Event
from toolfleet.schemas.serialize import to_jsonable
from toolfleet.schemas.signature import validation_problems
from toolfleet.schemas.tool import Tool, is_coro_func

__all__ = [
    "GRAPH_RESUME_KEY",
    "REDACTED",
    "FunctionCalling",
    "normalize_arguments",
    "redact",
    "tool_arguments",
]

REDACTED = "***"
# The argument that carries a LangGraph tool's resume values to its worker (FleetToolNode):
# not the tool's, so it is kept out of validation and never passed to the function.
GRAPH_RESUME_KEY = "__langgraph_resume__"


def redact(arguments: Mapping[str, Any], secret_args: frozenset[str]) -> dict[str, Any]:
    """A copy of ``arguments`` with the value of every secret argument replaced by ``***``."""
    return {k: (REDACTED if k in secret_args else v) for k, v in arguments.items()}


def tool_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` without the resume values of a LangGraph tool: what the function takes."""
    return {k: v for k, v in arguments.items() if k != GRAPH_RESUME_KEY}


def normalize_arguments(tool: Tool, arguments: Any) -> dict[str, Any]:
    """Validate ``arguments`` against ``tool`` and return the normalized dict.

    Raises ArgumentValidationError naming the tool and what is wrong. The resume values of a
    LangGraph tool (:data:`GRAPH_RESUME_KEY`) are not validated and stay as they are.
    """
    if isinstance(arguments, Mapping) and GRAPH_RESUME_KEY in arguments:
        resume = arguments[GRAPH_RESUME_KEY]
        return {**_normalized(tool, tool_arguments(arguments)), GRAPH_RESUME_KEY: resume}
    return _normalized(tool, arguments)


def _normalized(tool: Tool, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, BaseModel):
        arguments = arguments.model_dump(exclude_unset=True)
    if not isinstance(arguments, Mapping):
        raise ArgumentValidationError(
            f"arguments for tool {tool.function!r} must be a dict of parameter names to "
            f"values, got {type(arguments).__name__}: {_preview(arguments)}"
        )
    arguments = dict(arguments)
    bad_keys = [k for k in arguments if not isinstance(k, str)]
    if bad_keys:
        raise ArgumentValidationError(
            f"argument names for tool {tool.function!r} must be strings, "
            f"got {safe_repr(bad_keys[:5])}"
        )
    keys = set(arguments)
    if tool.strict and keys != tool.required_fields:
        raise ArgumentValidationError(
            f"strict tool {tool.function!r} takes exactly {sorted(tool.required_fields)}, "
            f"got {sorted(keys)}; pass every parameter and nothing else"
        )
    if tool.request_options is not None:
        try:
            model = tool.request_options.model_validate(arguments)
        except ValidationError as exc:
            raise ArgumentValidationError(
                f"arguments for tool {tool.function!r} do not match "
                f"{tool.request_options.__name__}: {_validation_summary(exc)}",
                argument=_first_argument(exc),
            ) from None
        return model.model_dump(exclude_unset=True)
    if not tool.strict:
        missing = tool.minimum_acceptable_fields - keys
        if missing:
            raise ArgumentValidationError(
                f"tool {tool.function!r} is missing required arguments {sorted(missing)}; "
                f"it takes {sorted(tool.required_fields)}",
                argument=min(missing),
            )
        unknown = keys - tool.required_fields
        if unknown and not tool.accepts_extra_arguments:
            raise ArgumentValidationError(
                f"tool {tool.function!r} got unknown arguments {sorted(unknown)}; "
                f"it takes {sorted(tool.required_fields)}",
                argument=min(unknown),
            )
    return _validated(tool, arguments)


def _validated(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` checked against the tool's published schema; a converted value (pydantic's
    lax mode, or strict for a strict tool) replaces the original, as JSON."""
    model = tool.arguments_model
    try:
        # JSON arguments that fit as sent are sent as they are (an int for a float stays int).
        checked: BaseModel | None = model.model_validate(arguments, strict=True)
        if all(type(value) in _JSON_TYPES for value in arguments.values()):
            return arguments
    except ValidationError as exc:
        if tool.strict:
            raise _refused(tool, model, exc) from None
        checked = None
    if checked is None:
        try:
            checked = model.model_validate(arguments)
        except ValidationError as exc:
            raise _refused(tool, model, exc) from None
    # Only typed arguments are re-encoded: an untyped one keeps its value, so a non-JSON
    # value still fails the wire check with its own clear error.
    typed = tool.typed_arguments & arguments.keys()
    if typed:
        try:
            arguments.update(checked.model_dump(mode="json", include=set(typed)))
        except Exception:  # a typed value with no JSON form: the wire check names it
            pass
    return arguments


_JSON_TYPES = frozenset({str, int, float, bool, type(None), list, dict})


def _refused(tool: Tool, model: type[BaseModel], exc: ValidationError) -> ArgumentValidationError:
    return ArgumentValidationError(
        f"tool {tool.function!r}: {validation_problems(model, exc, tool.secret_args)}; "
        f"send values of the types its schema declares (`toolfleet tools` shows it)",
        argument=_first_argument(exc),
    )


def _first_argument(exc: ValidationError) -> str | None:
    """The name of the first argument pydantic refused (None for the arguments as a whole)."""
    errors = exc.errors()
    loc = errors[0]["loc"] if errors else ()
    return str(loc[0]) if loc else None


class FunctionCalling(Event):
    """preprocessor → callable → postprocessor, with the outcome recorded as data."""

    func_tool: Tool = Field(..., exclude=True)
    arguments: dict[str, Any]
    timeout_s: float | None = Field(default=None, exclude=True)

    def __init__(self, **data: Any) -> None:
        # Validate before pydantic does, so a bad call raises ArgumentValidationError
        # itself (not a wrapped ValidationError that would echo secret values).
        tool = data.get("func_tool")
        if isinstance(tool, Mapping):
            # Otherwise pydantic would build the Tool later and skip argument validation.
            tool = data["func_tool"] = Tool.model_validate(tool)
        if isinstance(tool, Tool):
            data["arguments"] = normalize_arguments(tool, data.get("arguments", {}))
            if data.get("timeout_s") is None:
                data["timeout_s"] = tool.timeout_s
        super().__init__(**data)

    @property
    def function(self) -> str:
        return self.func_tool.function

    async def _invoke(self) -> Any:
        if self.timeout_s is None:
            return await self._pipeline()
        deadline = asyncio.timeout(self.timeout_s)
        try:
            async with deadline:
                return await self._pipeline()
        except TimeoutError:
            # A TimeoutError the tool raised itself is its own failure, not our deadline.
            if not deadline.expired():
                raise
            raise ToolTimeoutError(
                f"tool {self.function!r} exceeded its timeout_s={self.timeout_s:g}",
                timeout_s=self.timeout_s,
            ) from None

    async def _pipeline(self) -> Any:
        tool = self.func_tool
        if tool.preprocessor is not None:
            self.arguments = await self._call(
                "preprocessor", tool.preprocessor, self.arguments, **tool.preprocessor_kwargs
            )
        response = await self._call("callable", tool.func_callable, **self.arguments)
        if tool.postprocessor is not None:
            response = await self._call(
                "postprocessor", tool.postprocessor, response, **tool.postprocessor_kwargs
            )
        return response

    async def _call(self, role: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if is_coro_func(func):
            return await func(*args, **kwargs)
        result = func(*args, **kwargs)
        if inspect.isawaitable(result):
            if isinstance(result, asyncio.Future):
                result.cancel()  # a Task must not run on, orphaned, after the call failed
            else:
                close = getattr(result, "close", None)
                if callable(close):
                    close()  # never leave a "coroutine was never awaited" warning behind
            raise WrongTypeError(
                f"tool {self.function!r}: its {role} is declared sync but returned an "
                f"awaitable ({type(result).__name__}); declare it `async def` or return a value"
            )
        return result

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["function"] = self.function
        data["arguments"] = to_jsonable(self._shown_arguments())
        return data

    def _shown_arguments(self) -> Any:
        # A preprocessor may have replaced the arguments with a non-dict (the call then
        # FAILED); the record must still serialize.
        if isinstance(self.arguments, Mapping):
            return redact(self.arguments, self.func_tool.secret_args)
        return self.arguments

    def __repr_args__(self) -> Any:
        # repr() ends up in logs; secret argument values must not.
        for name, value in super().__repr_args__():
            yield name, (self._shown_arguments() if name == "arguments" else value)


def _preview(value: Any, limit: int = 80) -> str:
    return safe_repr(value, limit)


def _validation_summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
