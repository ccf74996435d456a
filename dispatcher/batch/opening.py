"""Opening a call in a batch: the context the accept step admitted, or the ABORTED unit of a
call it refused (toolfleet.dispatcher.accept.admission), recorded like any other result."""

from __future__ import annotations

from toolfleet.dispatcher.accept.admission import Item, Refused, admit
from toolfleet.dispatcher.accept.context import CallContext
from toolfleet.dispatcher.batch.units import aborted_unit
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.history.history import Unit

__all__ = ["open_call"]


def open_call(
    item: Item, fleet: Fleet, branch_id: str | None, call_id: str, *, raise_after: bool
) -> CallContext | Unit:
    """One request's context, or the ABORTED unit of a call the accept step refused."""
    admitted = admit(item, fleet, branch_id, call_id)
    if isinstance(admitted, Refused):
        return aborted_unit(
            admitted.context, admitted.error, raise_after=raise_after, hook=admitted.hook
        )
    return admitted
