"""The tool side of the OpenAI Agents SDK adapter: :func:`fleet_tool`, and how a tool that
takes the SDK's run context gets it on a worker.

A module of tools imported by the workers (``TOOLFLEET_TOOLS``) and by the agent's process
imports this one; it needs the SDK and toolfleet's registry, not the dispatcher. The agent's
side is :mod:`toolfleet.adapters.openai_agents`, which re-exports :func:`fleet_tool`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Annotated, Any, get_args, get_type_hints, overload

from pydantic import BaseModel, TypeAdapter, ValidationError, create_model
from pydantic.json_schema import SkipJsonSchema

from toolfleet.schemas.errors import ArgumentValidationError, ConfigurationError
from toolfleet.workers.registry import Registry
from toolfleet.workers.registry import registry as default_registry
from toolfleet.workers.registry import tool as register_tool

try:
    from agents import FunctionTool, function_tool
    from agents.function_schema import function_schema
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConfigurationError(
        f"the OpenAI Agents SDK is not installed ({exc}); pip install 'toolfleet[openai-agents]'"
    ) from exc

__all__ = [
    "context_preprocessor",
    "context_type_of",
    "fleet_tool",
    "takes_sdk_context",
    "with_context_field",
]


@overload
def fleet_tool(func: Callable[..., Any], /) -> FunctionTool: ...


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
    **function_tool_kwargs: Any,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def fleet_tool(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    registry: Registry | None = None,
    secret_args: Iterable[str] = (),
    timeout_s: float | None = None,
    idempotent: bool = False,
    **function_tool_kwargs: Any,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Register ``func`` as a toolfleet tool and return the SDK's ``FunctionTool`` of it;
    ``@fleet_tool`` or ``@fleet_tool(...)``.

    Use it in a module both the workers (``TOOLFLEET_TOOLS``) and the agent's process import.
    ``name``, ``secret_args``, ``timeout_s`` and ``idempotent`` are toolfleet's; the other
    keyword arguments go to the SDK's ``function_tool`` (``failure_error_function``,
    ``needs_approval``, ...). A function whose first parameter is the SDK's
    ``RunContextWrapper``/``ToolContext`` receives, on the worker, a ``ToolContext`` whose
    ``context`` is the run's context carried as JSON, rebuilt into the type the parameter
    declares when that is a pydantic model or a dataclass (docs/agent-ecosystem.md, "The run
    context"); that argument is never taken from the model, and never shows in the spec,
    history, logs or Flower.
    """

    def make(f: Callable[..., Any]) -> FunctionTool:
        sdk_tool = function_tool(f, name_override=name, **function_tool_kwargs)
        schema = function_schema(f, name_override=name)
        secrets = set(secret_args)
        preprocessor: Callable[..., Any] | None = None
        preprocessor_kwargs: dict[str, Any] | None = None
        request_options: type[BaseModel] | None = None
        if schema.takes_context:
            param = next(iter(schema.signature.parameters))
            preprocessor = context_preprocessor
            preprocessor_kwargs = {"param": param, "context_type": context_type_of(f, param)}
            request_options = with_context_field(schema.params_pydantic_model, param)
            secrets.add(param)
        register_tool(
            name=sdk_tool.name,
            request_options=request_options,
            preprocessor=preprocessor,
            preprocessor_kwargs=preprocessor_kwargs,
            secret_args=secrets,
            timeout_s=timeout_s,
            idempotent=idempotent,
            registry=registry if registry is not None else default_registry,
        )(f)
        return sdk_tool

    if func is not None:
        return make(func)
    return make


def context_preprocessor(
    arguments: dict[str, Any], *, param: str, context_type: Any = None
) -> dict[str, Any]:
    """Worker side of a context-taking tool: its context argument, as sent, becomes the SDK's
    ``ToolContext`` (the run context, the tool name and ids). A context the tool types as a
    pydantic model or a dataclass (``RunContextWrapper[MyContext]``) is rebuilt from its JSON;
    one that does not fit the type fails the call, naming the type."""
    sent = arguments.get(param)
    sent = sent if isinstance(sent, dict) else {}
    context = sent.get("context")
    if context is not None and context_type is not None:
        try:
            context = TypeAdapter(context_type).validate_python(context)
        except ValidationError as exc:
            raise ArgumentValidationError(
                f"the run context does not fit {context_type.__qualname__}, the type the "
                f"tool's {param!r} parameter declares: {exc}"
            ) from None
    ctx: ToolContext[Any] = ToolContext(
        context=context,
        tool_name=str(sent.get("tool_name") or ""),
        tool_call_id=str(sent.get("tool_call_id") or ""),
        tool_arguments=str(sent.get("tool_arguments") or ""),
    )
    return {**arguments, param: ctx}


def context_type_of(func: Callable[..., Any], param: str) -> type | None:
    """The ``T`` of a ``RunContextWrapper[T]``/``ToolContext[T]`` parameter when it is a pydantic
    model or a dataclass (the types the worker rebuilds from JSON); None otherwise."""
    try:
        annotation = get_type_hints(func).get(param)
    except Exception:  # an annotation that does not resolve: the context stays JSON
        return None
    for candidate in get_args(annotation):
        if isinstance(candidate, type) and (
            issubclass(candidate, BaseModel) or dataclasses.is_dataclass(candidate)
        ):
            return candidate
    return None


def with_context_field(model: type[BaseModel], param: str) -> type[BaseModel]:
    """The SDK's argument model of a tool plus its hidden context argument: the published
    schema is the SDK's, and the context the dispatcher adds is accepted."""
    fields: Any = {param: (Annotated[dict[str, Any] | None, SkipJsonSchema()], None)}
    return create_model(f"{model.__name__}_on_fleet", __base__=model, **fields)


def takes_sdk_context(func: Callable[..., Any]) -> bool:
    """True when ``func``'s first parameter is the SDK's run context (the SDK's own rule)."""
    try:
        return function_schema(func).takes_context
    except Exception:  # not a signature the SDK can read: it cannot take the SDK's context
        return False
