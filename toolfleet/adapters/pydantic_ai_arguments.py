"""How a fleet tool's arguments are checked in the agent's process, as Pydantic AI's argument
validators: :class:`LocalArguments` (Pydantic AI's own validator of the function, as for a
local tool) and :class:`ArgumentsCheck` (toolfleet's, for a tool with a request model or
processors). Both drop a value the model sends under the run context's parameter.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pydantic_core
from pydantic_ai import ModelRetry
from pydantic_ai import Tool as PydanticAITool

from toolfleet.schemas.errors import ArgumentValidationError
from toolfleet.schemas.function_calling import normalize_arguments
from toolfleet.schemas.tool import Tool

__all__ = ["ArgumentsCheck", "LocalArguments"]


class LocalArguments:
    """Pydantic AI's own validation of a fleet tool's arguments (its retry prompts, its
    errors), with the run context's parameter taken out: a value the model sends under that
    name is dropped, never sent (the run's own context is)."""

    def __init__(self, local: PydanticAITool[Any], context_param: str | None) -> None:
        self.local = local
        self.context_param = context_param

    def validate_json(
        self,
        input: str | bytes | bytearray,
        *,
        allow_partial: bool | Literal["off", "on", "trailing-strings"] = False,
        **kwargs: Any,
    ) -> Any:
        validator = self.local.function_schema.validator
        if self.context_param is not None:
            try:
                parsed = pydantic_core.from_json(input or "{}")
            except ValueError:
                parsed = None  # the validator below says what is wrong, as for a local tool
            if isinstance(parsed, dict) and self.context_param in parsed:
                del parsed[self.context_param]
                input = pydantic_core.to_json(parsed)
        return validator.validate_json(input, allow_partial=allow_partial, **kwargs)

    def validate_python(
        self,
        input: Any,
        *,
        allow_partial: bool | Literal["off", "on", "trailing-strings"] = False,
        **kwargs: Any,
    ) -> Any:
        if self.context_param is not None and isinstance(input, dict):
            input = {k: v for k, v in input.items() if k != self.context_param}
        validator = self.local.function_schema.validator
        return validator.validate_python(input, allow_partial=allow_partial, **kwargs)


class ArgumentsCheck:
    """The tool's argument check, as a Pydantic AI argument validator: the model's arguments,
    unchanged, when toolfleet would accept them; else ``ModelRetry`` saying why. A value under
    the run context's parameter is dropped first, as by :class:`LocalArguments`."""

    def __init__(self, tool: Tool, context_param: str | None = None) -> None:
        self.tool = tool
        self.context_param = context_param

    def validate_json(
        self,
        input: str | bytes | bytearray,
        *,
        allow_partial: bool | Literal["off", "on", "trailing-strings"] = False,
        **kwargs: Any,
    ) -> Any:
        try:
            arguments = json.loads(input or "{}")
        except ValueError as exc:
            raise ModelRetry(
                f"the arguments are not valid JSON ({exc}); send a JSON object"
            ) from None
        return self.validate_python(arguments, allow_partial=allow_partial)

    def validate_python(
        self,
        input: Any,
        *,
        allow_partial: bool | Literal["off", "on", "trailing-strings"] = False,
        **kwargs: Any,
    ) -> Any:
        arguments = {} if input is None else input
        if self.context_param is not None and isinstance(arguments, dict):
            arguments = {k: v for k, v in arguments.items() if k != self.context_param}
        try:
            normalize_arguments(self.tool, arguments)
        except ArgumentValidationError as exc:
            raise ModelRetry(str(exc)) from None
        return dict(arguments)
