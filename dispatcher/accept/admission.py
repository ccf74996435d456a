"""Admitting a call: its id, its normalized context with the tool it names and its validated
arguments, or the refusal of a call nothing else may see (malformed request, unknown tool,
unreadable or invalid arguments), with a context whose arguments are redacted one way.
The batch records each refusal (toolfleet.dispatcher.batch.opening)."""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from toolfleet.dispatcher.accept.context import CallContext, call_id_for, new_call_id
from toolfleet.dispatcher.accept.envelope import Envelope, custom_arguments
from toolfleet.schemas.contract import safe_repr, safe_text
from toolfleet.schemas.errors import (
    ArgumentValidationError,
    MalformedRequestError,
    UnknownToolError,
)
from toolfleet.schemas.function_calling import GRAPH_RESUME_KEY, normalize_arguments
from toolfleet.schemas.record import bounded_arguments, shown_arguments
from toolfleet.schemas.serialize import format_error
from toolfleet.schemas.tool import Tool

__all__ = ["Item", "Refused", "Tools", "admit", "initial_call_id"]

Item = Envelope | MalformedRequestError


class Tools(Protocol):
    """What admitting a call needs of the fleet: its tools, and the secret argument names its
    workers announced for tools this process has not imported."""

    @property
    def registry(self) -> Container[Any]: ...

    def tool(self, function: str) -> Tool: ...

    def announced_secret_args(self, function: Any) -> frozenset[str] | None: ...


@dataclass(frozen=True)
class Refused:
    """A call refused here: the context it is recorded under and why (``hook``: whether the
    TOOL_ERROR hooks hear of it; a malformed request names no tool to hook)."""

    context: CallContext
    error: Exception
    hook: bool = True


def initial_call_id(item: Item, branch_id: str | None) -> str:
    """A call's id, fixed before the batch runs (the journal lists it): derived from the
    model's tool_call_id when it gave one."""
    if isinstance(item, MalformedRequestError):
        # Never enqueued, so no idempotency to keep; a fresh id cannot collide with a
        # valid call of the same tool_call_id (a duplicate in the batch).
        return new_call_id()
    return call_id_for(branch_id, item.tool_call_id)


def admit(item: Item, fleet: Tools, branch_id: str | None, call_id: str) -> CallContext | Refused:
    """Normalize one request: its context, or its refusal (malformed request, unknown tool,
    unreadable or invalid arguments)."""
    if isinstance(item, MalformedRequestError):
        return Refused(_context(item, branch_id, "", {}, call_id), item, hook=False)
    try:
        if item.arguments_error is not None:
            # JSON-string arguments that did not decode: this call's error alone.
            raise ArgumentValidationError(item.arguments_error)
        tool = fleet.tool(item.function)
        raw = item.arguments
        if item.tool_call_type == "custom":
            raw = custom_arguments(tool, raw)  # free-form text: the one string parameter
        arguments = normalize_arguments(tool, raw)
        # Resume values come from the envelope only (Envelope.graph_resume); one a model put
        # in the arguments is dropped before enqueue, as any value the framework injects.
        arguments.pop(GRAPH_RESUME_KEY, None)
        if item.graph_resume is not None:
            arguments[GRAPH_RESUME_KEY] = list(item.graph_resume)
    except Exception as exc:
        return Refused(_refused_context(item, fleet, branch_id, call_id), _refusal(item, exc))
    return _context(item, branch_id, item.function, arguments, call_id, tool)


def _context(
    item: Item,
    branch_id: str | None,
    function: str,
    arguments: dict[str, Any],
    call_id: str,
    tool: Any = None,
) -> CallContext:
    """A call's context, its ids taken from the model's tool_call_id when it gave one."""
    request = None if isinstance(item, MalformedRequestError) else item.request
    return CallContext(
        function,
        arguments,
        branch_id,
        call_id=call_id,
        tool=tool,
        tool_call_id=item.tool_call_id or "",
        request=request,
        tool_call_type="custom" if item.tool_call_type == "custom" else "function",
    )


def _refused_context(
    item: Envelope, fleet: Tools, branch_id: str | None, call_id: str
) -> CallContext:
    """The context of a call refused before it was normalized: whatever the caller passed
    (lone surrogates, non-string keys, raising mappings), it can be recorded."""
    function = safe_text(item.function)
    known = fleet.tool(item.function) if item.function in fleet.registry else None
    # No tool here: the secrets the workers announced for it, else (None) none is known, so
    # keep the names and hide every value.
    secret = known.secret_args if known is not None else fleet.announced_secret_args(function)
    try:
        if isinstance(item.arguments, Mapping):
            raw = dict(item.arguments)
        elif isinstance(item.arguments, str):
            # The model's text that was not a JSON object: a bounded preview of it.
            raw = bounded_arguments(item.arguments, secret)
        else:
            raw = {}
    except Exception:
        raw = {}
    if known is not None:
        return _context(item, branch_id, function, raw, call_id, known)
    return _context(item, branch_id, function, shown_arguments(raw, secret), call_id)


def _refusal(item: Envelope, exc: Exception) -> Exception:
    """A toolfleet error for a call refused before enqueue, whatever normalizing raised."""
    if isinstance(exc, ArgumentValidationError | UnknownToolError):
        return exc
    return ArgumentValidationError(
        f"arguments for tool {safe_repr(item.function)} could not be read "
        f"({format_error(exc)}); pass a dict of JSON values"
    )
