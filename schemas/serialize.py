"""Conversion of arbitrary Python values into JSON-compatible data."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["UNSERIALIZABLE", "describe_exception", "format_error", "to_jsonable"]

UNSERIALIZABLE = "<unserializable>"

# Recursion guard: a payload nested deeper than this is not data an agent can use.
_MAX_DEPTH = 100


class _Unserializable(Exception):
    pass


def describe_exception(exc: BaseException) -> dict[str, str]:
    """``{"error": <type name>, "message": <text>}``, the ADR-0012 exception shape."""
    return {"error": type(exc).__name__, "message": str(exc)}


def format_error(exc: BaseException) -> str:
    """``"<Type>: <message>"``, the text stored in ``ActionResponseContent.error``."""
    return f"{type(exc).__name__}: {exc}"


def to_jsonable(value: Any) -> Any:
    """Convert ``value`` recursively; return ``"<unserializable>"`` if any part cannot be."""
    try:
        return _convert(value, 0)
    except (_Unserializable, RecursionError):
        return UNSERIALIZABLE


def _convert(value: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise _Unserializable
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise _Unserializable
    if isinstance(value, enum.Enum):
        return _convert(value.value, depth + 1)
    if isinstance(value, BaseException):
        return describe_exception(value)
    if isinstance(value, BaseModel):
        return _convert(value.model_dump(mode="python"), depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _convert(
            {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, depth + 1
        )
    if isinstance(value, Mapping):
        return {str(k): _convert(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_convert(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_convert(v, depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        raise _Unserializable
    raise _Unserializable
