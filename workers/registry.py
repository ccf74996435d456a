"""The tool registry: which functions a worker may run, by name. Nothing else is ever imported."""

from __future__ import annotations

import importlib
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from pydantic import BaseModel

from toolfleet.schemas.errors import ConfigurationError, DuplicateToolError, UnknownToolError
from toolfleet.schemas.tool import Tool, is_lionagi_tool

if TYPE_CHECKING:
    from anthropic.types import ToolParam as AnthropicToolParam
    from openai.types.chat import ChatCompletionFunctionToolParam
    from openai.types.responses import FunctionToolParam

__all__ = ["Registry", "registry", "tool"]

F = TypeVar("F", bound=Callable[..., Any])


class Registry:
    """Tools by function name, plus the modules imported to fill it."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._modules: list[str] = []
        # Set where a worker starts: an unknown tool is then the worker's to know, not the
        # calling program's (the dispatcher checks its own registry before a call is sent).
        self.in_worker = False
        # Registration happens at import time, which may race in threaded tests.
        self._lock = threading.RLock()

    def register(self, tool: Tool, *, update: bool = False) -> Tool:
        """Add ``tool`` under ``tool.function``; a taken name is an error unless ``update``."""
        with self._lock:
            existing = self._tools.get(tool.function)
            if (
                existing is not None
                and not update
                and existing.func_callable is not (tool.func_callable)
            ):
                raise DuplicateToolError(
                    f"a tool named {tool.function!r} is already registered (from "
                    f"{_origin(existing)}); rename one or pass update=True to replace it"
                )
            self._tools[tool.function] = tool
            return tool

    def get(self, name: str) -> Tool:
        """The tool registered as ``name``; UnknownToolError names the modules loaded."""
        try:
            return self._tools[name]
        except KeyError:
            loaded = list(self._modules) or "none"
            if self.in_worker:
                raise UnknownToolError(
                    f"no tool named {name!r} in this worker's registry (tool modules loaded: "
                    f"{loaded}); add the module defining it to the worker's TOOLFLEET_TOOLS "
                    f"or --tools"
                ) from None
            raise UnknownToolError(
                f"no tool named {name!r} is registered in this program (tool modules loaded: "
                f"{loaded}); add the module defining it to TOOLFLEET_TOOLS (or "
                f"Fleet.from_env(tools=[...])), as the workers load it"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._tools)

    # Typed per format as toolfleet.workers.specs.tool_specs is (the SDKs' own TypedDicts).
    @overload
    def specs(  # type: ignore[overload-overlap]
        self, format: Literal["openai"] = ..., *, names: Iterable[str] | None = None
    ) -> list[ChatCompletionFunctionToolParam]: ...
    @overload
    def specs(  # type: ignore[overload-overlap]
        self, format: Literal["openai-responses"], *, names: Iterable[str] | None = None
    ) -> list[FunctionToolParam]: ...
    @overload
    def specs(  # type: ignore[overload-overlap]
        self, format: Literal["anthropic"], *, names: Iterable[str] | None = None
    ) -> list[AnthropicToolParam]: ...
    @overload
    def specs(self, format: str, *, names: Iterable[str] | None = None) -> list[dict[str, Any]]: ...
    def specs(self, format: str = "openai", *, names: Iterable[str] | None = None) -> list[Any]:
        """The tools' definitions for a model, sorted by name (or in the order of ``names``).

        ``format``: ``openai`` (Chat Completions ``tools``), ``openai-responses``,
        ``anthropic`` (``tools`` of the Messages API) or ``mcp`` (``tools/list`` entries).
        """
        from toolfleet.workers.specs import tool_specs  # pydantic schema code, only when asked

        chosen = (
            [self.get(n) for n in names]
            if names is not None
            else [self._tools[n] for n in self.names()]
        )
        return tool_specs(chosen, format)

    def __contains__(self, item: object) -> bool:
        """A name, a Tool (toolfleet's or lionagi's) or a callable registered here."""
        if isinstance(item, str):
            return item in self._tools
        func = getattr(item, "func_callable", item)
        name = getattr(item, "function", None)
        if not isinstance(name, str):
            name = getattr(func, "__name__", None)
        existing = self._tools.get(name) if isinstance(name, str) else None
        if existing is None:
            return False
        return existing is item or existing.func_callable is func

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def loaded_modules(self) -> tuple[str, ...]:
        return tuple(self._modules)

    def load_modules(self, modules: Iterable[str], *, search_dir: str | None = None) -> None:
        """Import each tool module, so its ``@tool`` functions register themselves.

        ``search_dir`` (the working directory of ``toolfleet worker`` or ``run``) is searched
        after everything already on ``sys.path``, so a user's own ``schemas.py`` or
        ``dispatcher.py`` there cannot shadow an installed package.
        """
        if search_dir is not None and search_dir not in sys.path:
            sys.path.append(search_dir)
        for name in modules:
            name = name.strip()
            if not name:
                continue
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise ConfigurationError(
                    f"tool module {name!r} (from TOOLFLEET_TOOLS or --tools) cannot be "
                    f"imported: {exc}; check the module path and that it is importable "
                    f"from the worker's working directory or PYTHONPATH"
                ) from exc
            except Exception as exc:
                raise ConfigurationError(
                    f"tool module {name!r} raised {type(exc).__name__} at import "
                    f"({_where(exc)}): {exc}; fix the module, then start again"
                ) from exc
            with self._lock:
                if name not in self._modules:
                    self._modules.append(name)


def _where(exc: BaseException) -> str:
    """``file:line`` where ``exc`` was raised (for a SyntaxError, the offending line)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown location"
    return f"{frames[-1].filename}:{frames[-1].lineno}"


registry = Registry()


@overload
def tool(func: F, /) -> F: ...


@overload
def tool(
    func: None = None,
    /,
    *,
    name: str | None = None,
    request_options: type[BaseModel] | None = None,
    strict: bool = False,
    preprocessor: Callable[..., Any] | None = None,
    preprocessor_kwargs: dict[str, Any] | None = None,
    postprocessor: Callable[..., Any] | None = None,
    postprocessor_kwargs: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    secret_args: Iterable[str] = (),
    idempotent: bool = False,
    read_only: bool = False,
    destructive: bool | None = None,
    open_world: bool | None = None,
    rate_limit: str | None = None,
    max_concurrency: int | None = None,
    limit_key: str | None = None,
    approval: bool = False,
    update: bool = False,
    registry: Registry = registry,
) -> Callable[[F], F]: ...


def tool(
    func: F | None = None,
    /,
    *,
    name: str | None = None,
    request_options: type[BaseModel] | None = None,
    strict: bool = False,
    preprocessor: Callable[..., Any] | None = None,
    preprocessor_kwargs: dict[str, Any] | None = None,
    postprocessor: Callable[..., Any] | None = None,
    postprocessor_kwargs: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    secret_args: Iterable[str] = (),
    idempotent: bool = False,
    read_only: bool = False,
    destructive: bool | None = None,
    open_world: bool | None = None,
    rate_limit: str | None = None,
    max_concurrency: int | None = None,
    limit_key: str | None = None,
    approval: bool = False,
    update: bool = False,
    registry: Registry = registry,
) -> F | Callable[[F], F]:
    """Register a function as a tool; ``@tool`` or ``@tool(...)``. Returns the function.

    ``tool(lionagi_tool)`` registers a lionagi ``Tool`` with its processors.

    ``read_only``, ``destructive`` and ``open_world`` (with ``idempotent``) say what the tool
    does to the world; MCP clients see them as tool annotations (docs/mcp.md). A
    ``read_only`` tool, like an ``idempotent`` one, runs again after its worker is lost.

    ``rate_limit`` ("20/s", "100/m", "1000/h") and ``max_concurrency`` are fleet-wide, held
    in Redis by every worker before the tool runs; ``limit_key`` scopes both to one
    argument's value, or to the call's "branch" or "session" (docs/controls.md).

    ``approval=True``: every call of the tool waits, parked in Redis, until someone approves
    it (``toolfleet approve``, ``Fleet.approve``, an approval handler); denied or unanswered
    within ``CallParams.approval_timeout_s``, it is not run (docs/controls.md).

    A tool returns JSON data (pydantic models, dataclasses, datetimes, UUIDs are converted).
    A value with no JSON form (bytes, a plain object) still completes its call, with the
    output ``"<unserializable>"`` (ADR-0012 D1); the worker logs a warning naming the tool
    and the type, once per tool per worker process.
    """

    def decorate(f: F) -> F:
        if is_lionagi_tool(f):
            # A lionagi Tool brings its own name, request model and processors; what is
            # passed here explicitly wins.
            built = Tool.from_lionagi(
                f,
                function=name,
                request_options=request_options,
                strict=strict or None,
                preprocessor=preprocessor,
                preprocessor_kwargs=preprocessor_kwargs,
                postprocessor=postprocessor,
                postprocessor_kwargs=postprocessor_kwargs,
                timeout_s=timeout_s,
                secret_args=tuple(secret_args) or None,
                idempotent=idempotent or None,
                read_only=read_only or None,
                destructive=destructive,
                open_world=open_world,
                rate_limit=rate_limit,
                max_concurrency=max_concurrency,
                limit_key=limit_key,
                approval=approval or None,
            )
            registry.register(built, update=update)
            return f
        built = Tool(
            func_callable=f,
            function=name or "",
            request_options=request_options,
            strict=strict,
            preprocessor=preprocessor,
            preprocessor_kwargs=preprocessor_kwargs or {},
            postprocessor=postprocessor,
            postprocessor_kwargs=postprocessor_kwargs or {},
            timeout_s=timeout_s,
            secret_args=secret_args,
            idempotent=idempotent,
            read_only=read_only,
            destructive=destructive,
            open_world=open_world,
            rate_limit=rate_limit,
            max_concurrency=max_concurrency,
            limit_key=limit_key,
            approval=approval,
        )
        registry.register(built, update=update)
        return f

    if func is not None:
        return decorate(func)
    return decorate


def _origin(t: Tool) -> str:
    func = t.func_callable
    module = getattr(func, "__module__", None) or "?"
    qualname = getattr(func, "__qualname__", None) or t.function
    return f"{module}.{qualname}"
