"""Normalize one action-request envelope into ``(function, raw arguments)`` (ADR-0012 D2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from schemas.contract import safe_repr
from schemas.errors import MalformedRequestError
from schemas.messages import ActionRequest

__all__ = ["Envelope", "normalize"]

_PREVIEW_CHARS = 80


@dataclass(frozen=True, slots=True)
class Envelope:
    """The function name and the arguments exactly as the caller proposed them."""

    function: str
    arguments: Any


def normalize(request: Any) -> Envelope:
    """Accept an ActionRequest, a model declaring ``function`` and ``arguments``, or a dict
    with both keys; raise MalformedRequestError (a ValueError) for any other shape."""
    if isinstance(request, ActionRequest):
        return Envelope(request.content.function, dict(request.content.arguments))
    if isinstance(request, BaseModel):
        fields = type(request).model_fields
        if "function" in fields and "arguments" in fields:
            return _checked(request.function, request.arguments, request)  # type: ignore[attr-defined]
        raise MalformedRequestError(
            f"action request model {type(request).__name__} declares "
            f"{sorted(fields)[:10]}, not both 'function' and 'arguments'; "
            "declare both fields or pass an ActionRequest"
        )
    if isinstance(request, Mapping):
        if "function" in request and "arguments" in request:
            return _checked(request["function"], request["arguments"], request)
        raise MalformedRequestError(
            f"action request dict has keys {safe_repr(list(request)[:10])}, not both "
            f"'function' and 'arguments': {_preview(request)}; add the missing key"
        )
    raise MalformedRequestError(
        f"action request must be an ActionRequest, a model or a dict with 'function' and "
        f"'arguments', got {type(request).__name__}: {_preview(request)}"
    )


def _checked(function: Any, arguments: Any, request: Any) -> Envelope:
    if not isinstance(function, str) or not function:
        raise MalformedRequestError(
            f"action request 'function' must be a non-empty tool name, got {safe_repr(function)} "
            f"in {_preview(request)}"
        )
    return Envelope(function, arguments)


def _preview(value: Any) -> str:
    return safe_repr(value, _PREVIEW_CHARS)
