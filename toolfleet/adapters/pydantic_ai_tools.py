"""The tool side of the Pydantic AI adapter: :func:`fleet_tool`, and how a tool that takes
Pydantic AI's ``RunContext`` gets one on a worker.

A tool module imported by the workers (``TOOLFLEET_TOOLS``) and by the agent's process imports
this one; it needs Pydantic AI and toolfleet's registry, not the dispatcher. The agent's side is
:mod:`toolfleet.adapters.pydantic_ai`, which re-exports :func:`fleet_tool`.

The run context cannot cross a process boundary whole (its model, its agent, the message
history and the tool manager are live objects). What crosses is what Pydantic AI's own durable
execution carries to another worker (``DurableRunContext.serialize_run_context``: the run and
conversation ids, the tool's name, call id, retry and max retries, the run step, usage, the
approval flag and metadata, ...), plus the run's ``deps`` as JSON. The worker rebuilds a
:class:`FleetRunContext` from it: ``deps`` as the type the tool's ``RunContext[Deps]``
annotation names, every carried field readable, and reading any other field an error that
says so (never a silent default).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, overload

from pydantic import BaseModel, TypeAdapter, create_model
from pydantic.json_schema import SkipJsonSchema

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.signature import signature_model
from toolfleet.workers.registry import Registry
from toolfleet.workers.registry import registry as default_registry
from toolfleet.workers.registry import tool as register_tool

try:
    from pydantic_ai import Tool
    from pydantic_ai.durable_exec import DurableRunContext
    from pydantic_ai.exceptions import UserError
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"Pydantic AI is not installed ({exc}); pip install 'toolfleet[pydantic-ai]'"
    ) from exc

__all__ = [
    "FleetRunContext",
    "context_parameter",
    "fleet_tool",
    "run_context_preprocessor",
]


class FleetRunContext(DurableRunContext[Any]):
    """The ``RunContext`` a fleet tool gets on a worker: the fields that crossed, and ``deps``."""

    def unavailable_field_message(self, name: str) -> str:
        return (
            f"{name!r} of the RunContext is not available to a tool run on a toolfleet worker: "
            "only deps (as JSON) and the run's plain fields cross the process boundary; pass "
            "what the tool needs in deps, or keep the tool in the agent's process"
        )

    async def emit(self, event: Any, /) -> Any:
        raise UserError(
            "ctx.emit() is not available to a tool run on a toolfleet worker: the run's event "
            "stream is in the agent's process; report progress with "
            "toolfleet.current_call().progress(...) instead"
        )


@overload
def fleet_tool(func: Callable[..., Any], /) -> Callable[..., Any]: ...


@overload
def fleet_tool(
    func: None = None,
    /,
    *,
    name: str | None = None,
    registry: Registry | None = None,
    secret_args: Iterable[str] = (),
    timeout_s: float | None = None,
    idempotent: bool = False,
    approval: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def fleet_tool(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    registry: Registry | None = None,
    secret_args: Iterable[str] = (),
    timeout_s: float | None = None,
    idempotent: bool = False,
    approval: bool = False,
) -> Callable[..., Any] | Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``func`` as a toolfleet tool that an agent's ``FleetToolset`` runs as Pydantic
    AI runs a local tool; ``@fleet_tool`` or ``@fleet_tool(...)``. Returns the function.

    A function whose first parameter is Pydantic AI's ``RunContext`` receives, on the worker,
    a :class:`FleetRunContext`: the run's ``deps`` (sent as JSON, rebuilt as the type its
    ``RunContext[Deps]`` names) and the fields that cross a process boundary. The parameter is
    in no spec the model sees, a value the model sends under its name is dropped, and what is
    sent for it is a secret argument: redacted in history, logs and Flower. Other functions
    are registered as ``@tool`` registers them. ``approval=True``: every call waits for an
    approval (Pydantic AI's ``DeferredToolResults`` or ``toolfleet approve``).
    """

    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        secrets = set(secret_args)
        options: dict[str, Any] = {}
        param = context_parameter(f)
        if param is not None:
            options = {
                "preprocessor": run_context_preprocessor,
                "preprocessor_kwargs": {"param": param, "deps_type": _deps_type(f, param)},
                "request_options": _with_hidden_context(name or f.__name__, f, param),
            }
            secrets.add(param)
        register_tool(
            name=name,
            secret_args=secrets,
            timeout_s=timeout_s,
            idempotent=idempotent,
            approval=approval,
            registry=registry if registry is not None else default_registry,
            **options,
        )(f)
        return f

    if func is not None:
        return make(func)
    return make


def context_parameter(func: Callable[..., Any]) -> str | None:
    """The name of ``func``'s ``RunContext`` parameter, by Pydantic AI's own rule (the first
    parameter, annotated ``RunContext``); None when it takes none or is not a function Pydantic
    AI can read."""
    try:
        takes_ctx = Tool(func).takes_ctx
    except Exception:  # not a signature Pydantic AI reads: it cannot take the run context
        return None
    if not takes_ctx:
        return None
    return next(iter(inspect.signature(func).parameters))


def run_context_preprocessor(
    arguments: dict[str, Any], *, param: str, deps_type: Any = None
) -> dict[str, Any]:
    """Worker side of a context-taking tool: what the agent sent under ``param`` becomes a
    :class:`FleetRunContext` (``deps`` validated as ``deps_type`` when the tool names one)."""
    sent = arguments.get(param)
    sent = sent if isinstance(sent, dict) else {}
    deps = sent.get("deps")
    if deps_type is not None and deps is not None:
        deps = TypeAdapter(deps_type).validate_python(deps)
    run = sent.get("run")
    carried = dict(run) if isinstance(run, dict) else {}
    carried.pop("deps", None)
    return {**arguments, param: FleetRunContext(deps=deps, **carried)}


def _deps_type(func: Callable[..., Any], param: str) -> Any:
    """The ``Deps`` of a ``ctx: RunContext[Deps]`` annotation; None for a bare ``RunContext``,
    ``Any`` or ``object`` (the deps then arrive as their JSON value)."""
    try:
        annotation = typing.get_type_hints(func).get(param)
    except Exception:
        return None
    args = typing.get_args(annotation)
    if not args or args[0] in (Any, object) or isinstance(args[0], typing.TypeVar):
        return None
    return args[0]


def _with_hidden_context(name: str, func: Callable[..., Any], param: str) -> type[BaseModel]:
    """The tool's argument model without its context parameter, plus a field for what the
    agent sends for it: absent from the JSON Schema, so no spec shows it to a model."""
    parameters = {
        p: spec
        for p, spec in inspect.signature(func).parameters.items()
        if p != param
        and spec.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    extra = any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(func).parameters.values()
    )
    base = signature_model(name, func, parameters, extra)
    hidden: Any = {param: (Annotated[dict[str, Any] | None, SkipJsonSchema()], None)}
    return create_model(f"{base.__name__}_on_fleet", __base__=base, **hidden)
