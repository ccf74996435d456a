"""``Fleet.embedded(tools=[...])``: the embedded default as a library entry point.

A private Redis and one sync and one async worker, started for the block and stopped after
it (also on an error, Ctrl-C or SIGTERM), with a Fleet bound to them::

    with Fleet.embedded(tools=[shout]) as fleet:
        results = Branch(fleet=fleet).act_sync(calls)

    async with Fleet.embedded(tools=["mytools"]) as fleet:
        results = await Branch(fleet=fleet).act(calls)

The workers import the tools by module, so a tool defined in the script being run (module
``__main__``) cannot be sent to them: put tools in a module of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from types import ModuleType, TracebackType
from typing import Any, Generic, Protocol, TypeVar

from toolfleet.embedded.fleet import EmbeddedFleet
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import Settings

__all__ = ["LocalFleet", "tool_modules_of"]

ToolSource = str | ModuleType | Callable[..., Any]


class _Fleet(Protocol):
    """What the block needs of the fleet it yields (toolfleet.dispatcher.fleet.Fleet)."""

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


F = TypeVar("F", bound=_Fleet)


def tool_modules_of(tools: Iterable[ToolSource]) -> tuple[str, ...]:
    """The module names the workers import for ``tools``: module names as given, a module's
    name, or the module that defines a ``@tool`` function."""
    modules: list[str] = []
    for source in tools:
        if isinstance(source, str):
            name = source
        elif isinstance(source, ModuleType):
            name = source.__name__
        elif callable(source):
            name = getattr(source, "__module__", None) or ""
        else:
            raise ConfigurationError(
                f"tools holds {source!r}; give module names, modules or @tool functions"
            )
        if name == "__main__":
            raise ConfigurationError(
                f"{source!r} is defined in the script being run (__main__), which the workers "
                f"cannot import; move the tools to a module of their own and pass that"
            )
        if name and name not in modules:
            modules.append(name)
    return tuple(modules)


class LocalFleet(Generic[F]):
    """The context manager ``Fleet.embedded`` returns (sync and async)."""

    def __init__(
        self,
        fleet_type: Callable[[Settings], F],
        tools: Iterable[ToolSource],
        *,
        persist: bool = False,
        **settings: Any,
    ) -> None:
        self._fleet_type = fleet_type
        modules = tool_modules_of(tools)
        # The private Redis is this block's broker, whatever TOOLFLEET_BROKER_URL says.
        base = Settings.from_env(**settings).model_copy(update={"broker_url": None})
        self._embedded = EmbeddedFleet(modules, base=base, persist=persist)
        self.fleet: F | None = None

    def __enter__(self) -> F:
        settings = self._embedded.start()
        try:
            self.fleet = self._fleet_type(settings)
        except BaseException:
            self._embedded.stop()
            raise
        return self.fleet

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.fleet is not None:
                self.fleet.close()
        finally:
            self._embedded.stop()

    async def __aenter__(self) -> F:
        # Starting waits for Redis and both workers (bounded by their ready timeout): off
        # the loop, so its other tasks run meanwhile.
        return await asyncio.to_thread(self.__enter__)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.fleet is not None:
                await self.fleet.aclose()
        finally:
            await asyncio.to_thread(self.__exit__, exc_type, exc, tb)
