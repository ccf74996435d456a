"""One Agents SDK tool call on the caller's side, by the SDK's own rules.

The model's arguments are parsed and validated as the SDK's ``function_tool`` does before it
runs a local tool: text that is not a JSON object, or arguments its argument model refuses,
raise the SDK's ``ModelBehaviorError`` (with the SDK's message) before anything is sent; keys
the schema does not name are dropped, as the SDK's argument model ignores them, so a value the
model sends under the name of the hidden context parameter never leaves this process. The run
context travels as JSON; the output comes back rebuilt to the tool's declared return type, so
the model reads ``str(output)`` exactly as for a local tool.
"""

from __future__ import annotations

import builtins
import dataclasses
import inspect
import json
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from toolfleet.schemas.errors import ConfigurationError

try:
    from agents.exceptions import ModelBehaviorError
    from agents.function_schema import FuncSchema, function_schema
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"the OpenAI Agents SDK is not installed ({exc}); pip install 'toolfleet[openai-agents]'"
    ) from exc

__all__ = [
    "BOUND",
    "NOT_JSON",
    "SOURCE",
    "ToolShape",
    "context_as_json",
    "decode_arguments",
    "rebuild_output",
    "shape_of",
]

log = logging.getLogger(__name__)

# The attribute that marks an agent's fleet copy of a FunctionTool (its value: the binding).
BOUND = "_toolfleet_binding"
# The attribute that holds the FunctionTool a fleet copy was made from.
SOURCE = "_toolfleet_source"
# What context_as_json returns for a context with no JSON form.
NOT_JSON: Any = object()
_NO_ANNOTATION = (inspect.Signature.empty, Any, None, type(None), object)


@dataclass(frozen=True)
class ToolShape:
    """What the caller needs to know of one fleet tool, read from its function the SDK's way."""

    name: str
    schema: FuncSchema | None
    # The hidden parameter that receives the SDK's ToolContext (a fleet_tool's), if any.
    context_param: str | None = None
    output_adapter: TypeAdapter[Any] | None = None
    output_error: type[BaseException] | None = None

    @property
    def argument_names(self) -> frozenset[str] | None:
        """The keys the model may send (field names and aliases); None when unknown."""
        if self.schema is None:
            return None
        fields = self.schema.params_pydantic_model.model_fields
        return frozenset(fields) | {f.alias for f in fields.values() if f.alias}


def shape_of(
    name: str, func: Callable[..., Any], *, strict: bool, context_param: str | None
) -> ToolShape:
    """The shape of the tool ``name`` whose workers run ``func``."""
    try:
        schema: FuncSchema | None = function_schema(
            func, name_override=name, strict_json_schema=strict
        )
    except Exception:  # not a signature the SDK reads: toolfleet's own checks apply
        schema = None
    annotation = schema.return_annotation if schema is not None else inspect.Signature.empty
    output_adapter: TypeAdapter[Any] | None = None
    output_error: type[BaseException] | None = None
    if isinstance(annotation, type) and issubclass(annotation, BaseException):
        output_error = annotation
    elif not any(annotation is a for a in _NO_ANNOTATION):
        try:
            output_adapter = TypeAdapter(annotation)
        except Exception:  # an annotation pydantic cannot build: the output stays JSON
            output_adapter = None
    return ToolShape(name, schema, context_param, output_adapter, output_error)


def decode_arguments(shape: ToolShape, text: str) -> dict[str, Any]:
    """The model's arguments as the SDK's function tool reads them, minus the keys its schema
    does not name; raise ModelBehaviorError as the SDK does for text it cannot use."""
    base = f"Invalid JSON input for tool {shape.name}"
    try:
        decoded = json.loads(text) if text else {}
    except ValueError as exc:
        if _tool_data_hidden():
            raise ModelBehaviorError(base) from None
        raise ModelBehaviorError(f"{base}: {text}") from exc
    if not isinstance(decoded, dict):
        raise ModelBehaviorError(f"{base}: expected a JSON object")
    if shape.schema is None:
        return decoded
    model = shape.schema.params_pydantic_model
    try:
        model(**decoded) if decoded else model()
    except ValidationError as exc:
        if _tool_data_hidden():
            raise ModelBehaviorError(base) from None
        raise ModelBehaviorError(f"{base}: {exc}") from exc
    except TypeError as exc:  # a key that is not a string cannot come from JSON; kept for sure
        raise ModelBehaviorError(f"{base}: {exc}") from exc
    named = shape.argument_names or frozenset()
    dropped = sorted(k for k in decoded if k not in named)
    if dropped:
        # Names only: a dropped value may be anything the model made up, a secret included.
        log.debug(
            "tool %s: argument keys its schema does not name dropped: %s", shape.name, dropped
        )
    return {k: v for k, v in decoded.items() if k in named}


def context_as_json(value: Any) -> Any:
    """The run context's JSON value: JSON as it is, a pydantic model or a dataclass as its JSON
    dump; :data:`NOT_JSON` when it has none (a client, a connection, a live object)."""
    try:
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = TypeAdapter(type(value)).dump_python(value, mode="json")
        json.dumps(value, allow_nan=False)
    except Exception:
        return NOT_JSON
    return value


def warn_context_not_json(tool: str, value: Any) -> None:
    """The warning a run whose context cannot travel gets, at its first call of ``tool``."""
    warnings.warn(
        f"on_fleet: the run context of tool {tool!r} is a {type(value).__qualname__}, which "
        "has no JSON form: the worker's ctx.context is None. Pass a JSON value, a pydantic "
        "model or a dataclass of JSON fields as Runner.run(context=...), or send what the tool "
        "needs as arguments",
        RuntimeWarning,
        stacklevel=2,
    )


def rebuild_output(shape: ToolShape, output: Any) -> Any:
    """The worker's JSON output as the tool's declared return type (a pydantic model, a
    dataclass, a tuple, an exception), so ``str()`` of it is what the model reads of a local
    tool; the JSON value as it came when it does not fit the type."""
    if shape.output_error is not None:
        return _rebuilt_exception(shape.output_error, output)
    if shape.output_adapter is None:
        return output
    try:
        return shape.output_adapter.validate_python(output)
    except Exception:
        return output


def _rebuilt_exception(declared: type[BaseException], output: Any) -> Any:
    # A returned exception travels as {"error": <type name>, "message": <text>}.
    if not (isinstance(output, dict) and set(output) == {"error", "message"}):
        return output
    named = getattr(builtins, str(output["error"]), None)
    kind = declared
    if isinstance(named, type) and issubclass(named, declared):
        kind = named
    try:
        return kind(str(output["message"]))
    except Exception:  # an exception class that needs other arguments
        return output


def _tool_data_hidden() -> bool:
    """The SDK's switch that keeps tool data out of its logs and error texts."""
    try:
        from agents import _debug
    except ImportError:  # pragma: no cover - a later SDK without the switch
        return False
    return bool(getattr(_debug, "DONT_LOG_TOOL_DATA", False))
