"""How deeply a call's arguments may nest before the dispatcher refuses them.

A payload nested deeper than this is not data a tool can use, and past it the serializers on
the way fail in ways that would blame the wrong thing: ``json.dumps`` raises RecursionError,
pydantic refuses to dump the wire message (which sinks its whole publish chunk), and records
turn it into ``"<unserializable>"``. Refusing it up front gives that call alone a clear error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolfleet.schemas.errors import ArgumentValidationError

__all__ = ["MAX_ARGUMENT_DEPTH", "check_nesting"]

# Matches toolfleet.schemas.serialize's recursion guard, so whatever passes can be recorded
# faithfully.
MAX_ARGUMENT_DEPTH = 100


def check_nesting(
    function: str, arguments: Mapping[str, Any], max_depth: int = MAX_ARGUMENT_DEPTH
) -> None:
    """Raise ArgumentValidationError naming the argument nested deeper than ``max_depth``.

    Iterative, so a payload of any depth (or a self-referencing one) cannot exhaust the stack.
    """
    for key, value in arguments.items():
        stack: list[tuple[Any, int]] = [(value, 1)]
        while stack:
            item, depth = stack.pop()
            if isinstance(item, Mapping):
                children: Any = item.values()
            elif isinstance(item, (list, tuple, set, frozenset)):
                children = item
            else:
                continue
            if depth > max_depth:
                raise ArgumentValidationError(
                    f"argument {key!r} of tool {function!r} is nested more than {max_depth} "
                    f"levels deep; flatten it, or pass a reference (a path or URL) instead",
                    argument=str(key),
                )
            stack.extend((child, depth + 1) for child in children)
