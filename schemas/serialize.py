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

from toolfleet.schemas.contract import int_digits, safe_text

__all__ = [
    "UNSERIALIZABLE",
    "describe_exception",
    "format_error",
    "jsonable_key",
    "to_jsonable",
]

UNSERIALIZABLE = "<unserializable>"

# Recursion guard: a payload nested deeper than this is not data an agent can use.
_MAX_DEPTH = 100


class _Unserializable(Exception):
    pass


def describe_exception(exc: BaseException) -> dict[str, str]:
    """``{"error": <type name>, "message": <text>}``, the ADR-0012 exception shape."""
    return {"error": type(exc).__name__, "message": _exception_text(exc)}


def format_error(exc: BaseException) -> str:
    """``"<Type>: <message>"``, the text stored in ``ActionResponseContent.error``."""
    return f"{type(exc).__name__}: {_exception_text(exc)}"


def _exception_text(exc: BaseException) -> str:
    # A tool's exception with a broken __str__ must not crash the record of its failure.
    try:
        return safe_text(str(exc))
    except Exception:
        return f"<unprintable {type(exc).__name__}>"


def to_jsonable(value: Any) -> Any:
    """Convert ``value`` recursively; return ``"<unserializable>"`` if any part cannot be."""
    try:
        return _convert(value, 0)
    except Exception:
        # Besides _Unserializable and RecursionError: a model_dump, property or __iter__
        # that raises makes the value unserializable, never its event's serialization.
        return UNSERIALIZABLE


def _convert(value: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise _Unserializable
    # Enums first: an IntEnum or StrEnum must come out as its plain value.
    if isinstance(value, enum.Enum):
        return _convert(value.value, depth + 1)
    if value is None or type(value) is bool:
        return value
    if isinstance(value, int):
        return _int(int(value))
    if isinstance(value, str):
        # A lone surrogate would make the record's JSON unwritable: spell it out instead.
        return safe_text(str(value))
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        raise _Unserializable
    if isinstance(value, BaseException):
        return describe_exception(value)
    if isinstance(value, BaseModel):
        return _convert(value.model_dump(mode="python"), depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _convert(
            {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, depth + 1
        )
    if isinstance(value, Mapping):
        return {jsonable_key(k): _convert(v, depth + 1) for k, v in value.items()}
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


# Python refuses str() of an int over 4300 digits; json.dumps and every log line would raise.
_MAX_RECORDED_DIGITS = 4000


def _int(value: int) -> int | str:
    if abs(value).bit_length() > _MAX_RECORDED_DIGITS * 3:
        return f"<integer of about {int_digits(value)} digits>"
    return value


def jsonable_key(key: Any) -> str:
    """A mapping key as a JSON object key (a string that encodes as UTF-8); never raises."""
    if isinstance(key, str):
        return safe_text(key)
    if isinstance(key, int) and not isinstance(key, bool):
        converted = _int(key)
        return converted if isinstance(converted, str) else str(converted)
    try:
        return safe_text(str(key))
    except Exception:
        return f"<unprintable {type(key).__name__} key>"
