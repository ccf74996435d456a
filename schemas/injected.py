"""Parameters an agent framework fills in itself, never the model.

A tool may declare a parameter that its framework injects at the call: LangChain's
``Annotated[str, InjectedToolArg]`` and its subclasses (``InjectedToolCallId``, LangGraph's
``InjectedState("field")``, ``InjectedStore()``), or a parameter typed ``ToolRuntime``. Such a
parameter is not the model's to set: it is left out of the tool's spec and of the validation
of the model's arguments (:attr:`toolfleet.schemas.tool.Tool.injected_args`), and its value —
the framework's, sent by an adapter — is kept out of records, history and Flower like a secret
argument's.

Recognised by the markers' class names, so this wire-contract package imports no framework.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Union, get_args, get_origin

__all__ = ["INJECTION_MARKERS", "injected_parameters", "marks_injection"]

# The base classes of the frameworks' injection markers: LangChain's InjectedToolArg (with
# InjectedToolCallId, InjectedState, InjectedStore) and the class ToolRuntime derives from.
INJECTION_MARKERS = frozenset({"InjectedToolArg", "_DirectlyInjectedToolArg"})


def _is_marker_class(value: Any) -> bool:
    return isinstance(value, type) and any(
        base.__name__ in INJECTION_MARKERS for base in value.__mro__
    )


def marks_injection(annotation: Any) -> bool:
    """True when ``annotation`` says a framework injects the parameter: a marker class or
    instance in ``Annotated`` metadata, a marker class as the type itself (``ToolRuntime``,
    ``ToolRuntime[...]``), also inside ``Optional``/``Union``."""
    if _is_marker_class(annotation) or _is_marker_class(type(annotation)):
        return True
    origin = get_origin(annotation)
    if origin is Annotated or origin is Union or _is_union(origin):
        return any(marks_injection(arg) for arg in get_args(annotation))
    return _is_marker_class(origin)


def _is_union(origin: Any) -> bool:
    return origin is not None and getattr(origin, "__name__", "") == "UnionType"


def injected_parameters(
    func: Callable[..., Any], params: Mapping[str, inspect.Parameter]
) -> frozenset[str]:
    """The names among ``params`` (``func``'s) whose annotation :func:`marks_injection`."""
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception:
        # Unresolvable forward references: only the annotations that are objects count.
        hints = {}
    found = set()
    for name, param in params.items():
        annotation = hints.get(name, param.annotation)
        if annotation is not inspect.Parameter.empty and marks_injection(annotation):
            found.add(name)
    return frozenset(found)
