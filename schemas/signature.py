"""The arguments model of a tool: one pydantic model, built from the callable's signature,
that both publishes the tool's JSON Schema (its specs) and validates every call against it.

Checked where the schema is made: a model is told ``"type": "integer"`` for ``a: int``, so
``a="x"`` is refused before it is enqueued (and again on the worker, for a hand-made message)
instead of reaching the tool. Conversions are pydantic's lax ones ("5" for an ``int`` is 5);
a strict tool validates in strict mode. The values sent to the tool are JSON either way: a
converted value is re-encoded as JSON (a ``datetime`` argument arrives as ISO text).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model
from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError

from toolfleet.schemas.contract import safe_repr

__all__ = ["VALUE_PREVIEW_CHARS", "signature_model", "validation_problems"]

# How much of a refused value an error message quotes.
VALUE_PREVIEW_CHARS = 200


def signature_model(
    name: str, func: Callable[..., Any], params: Mapping[str, inspect.Parameter], extra: bool
) -> type[BaseModel]:
    """A model with one field per parameter: its annotation (``Any`` when it has none, or none
    with a JSON Schema) and its default. ``extra``: the callable takes ``**kwargs``."""
    try:
        hints = typing.get_type_hints(func)
    except Exception:
        # Unresolvable forward references: fall back to the raw (maybe string) annotations.
        hints = {}
    fields: dict[str, Any] = {}
    for param_name, param in params.items():
        annotation = hints.get(param_name, param.annotation)
        if annotation is inspect.Parameter.empty or isinstance(annotation, str):
            annotation = Any
        elif not _has_schema(annotation):
            annotation = Any  # an arbitrary class: any JSON value, the tool validates
        default = ... if param.default is inspect.Parameter.empty else param.default
        if default is not ... and not _jsonable(default):
            default = None
        fields[param_name] = (annotation, default)
    model: type[BaseModel] = create_model(
        f"{name}_arguments",
        __config__=ConfigDict(arbitrary_types_allowed=True, extra="allow" if extra else "ignore"),
        **fields,
    )
    return model


def validation_problems(
    model: type[BaseModel], exc: ValidationError, secret: frozenset[str]
) -> str:
    """One clause per refused argument: its name, the type it expects, the value (cut to
    :data:`VALUE_PREVIEW_CHARS`, a secret one redacted) and pydantic's reason."""
    parts = []
    for err in exc.errors()[:5]:
        loc = [str(p) for p in err["loc"]]
        top = loc[0] if loc else "<root>"
        field = model.model_fields.get(top)
        expected = _type_name(field.annotation) if field is not None else "no such argument"
        value = "***" if top in secret else _preview(err.get("input"))
        where = ".".join(loc) or "<root>"
        parts.append(f"argument {where!r} expects {expected}, got {value} ({err['msg']})")
    more = len(exc.errors()) - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _preview(value: Any) -> str:
    if isinstance(value, str) and len(value) > VALUE_PREVIEW_CHARS:
        return f"{value[:VALUE_PREVIEW_CHARS]!r}... ({len(value):,} characters)"
    return safe_repr(value, VALUE_PREVIEW_CHARS)


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _has_schema(annotation: Any) -> bool:
    try:
        TypeAdapter(annotation).json_schema()
    except (PydanticSchemaGenerationError, PydanticUserError, TypeError, ValueError):
        return False
    except Exception:  # pydantic's PydanticInvalidForJsonSchema and friends
        return False
    return True


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict | tuple)
