"""Opening a call: its id, its normalized context, or the ABORTED unit of a call refused
before anything else sees it (malformed request, unknown tool, unreadable or invalid
arguments). Every refusal here is recorded, and its arguments redacted, one way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolfleet.dispatcher.accept.context import CallContext, call_id_for, new_call_id
from toolfleet.dispatcher.accept.envelope import Envelope, custom_arguments
from toolfleet.dispatcher.batch.units import aborted_unit
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.history.history import Unit
from toolfleet.schemas.contract import safe_repr, safe_text
from toolfleet.schemas.errors import (
    ArgumentValidationError,
    MalformedRequestError,
    UnknownToolError,
)
from toolfleet.schemas.function_calling import GRAPH_RESUME_KEY, normalize_arguments
from toolfleet.schemas.record import bounded_arguments, shown_arguments
from toolfleet.schemas.serialize import format_error

__all__ = ["Item", "initial_call_id", "open_call"]

Item = Envelope | MalformedRequestError


def initial_call_id(item: Item, branch_id: str | None) -> str:
    """A call's id, fixed before the batch runs (the journal lists it): derived from the
    model's tool_call_id when it gave one."""
    if isinstance(item, MalformedRequestError):
        # Never enqueued, so no idempotency to keep; a fresh id cannot collide with a
        # valid call of the same tool_call_id (a duplicate in the batch).
        return new_call_id()
    return call_id_for(branch_id, item.tool_call_id)


def open_call(
    item: Item, fleet: Fleet, branch_id: str | None, call_id: str, *, raise_after: bool
) -> CallContext | Unit:
    """Normalize one request: its context, or the ABORTED unit of a call refused here
    (malformed request, unknown tool, unreadable or invalid arguments)."""
    if isinstance(item, MalformedRequestError):
        ctx = _context(item, branch_id, "", {}, call_id)
        return aborted_unit(ctx, item, raise_after=raise_after, hook=False)
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
        ctx = _refused_context(item, fleet, branch_id, call_id)
        return aborted_unit(ctx, _refusal(item, exc), raise_after=raise_after)
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
    item: Envelope, fleet: Fleet, branch_id: str | None, call_id: str
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
