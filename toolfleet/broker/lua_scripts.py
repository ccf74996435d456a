"""The Lua scripts toolfleet runs in Redis: files in ``toolfleet/broker/lua/``, read once.

Each ``<name>.lua`` there is one script, headed by a comment saying what it does, its KEYS and
its ARGV. :func:`lua_script` reads a file once per process (``importlib.resources``, so it works
from a checkout and from the installed wheel alike) and hashes it once; the
:class:`LuaScript` it returns runs on any client — asyncio or blocking, a client or a
pipeline — as redis-py's own ``Script`` does: one ``EVALSHA``, the text sent again
(``SCRIPT LOAD``) only when the server answers ``NOSCRIPT`` (after a restart). Nothing is read,
hashed or registered per call, and no script is kept on a redis client.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from redis.commands.core import AsyncScript, Script

from toolfleet.schemas.errors import ConfigurationError

__all__ = ["LUA_FOLDER", "LuaScript", "lua_names", "lua_script", "lua_source"]

# Where the scripts live, as a package resource of toolfleet.broker (shipped in the wheel:
# pyproject's package-data).
LUA_FOLDER = "lua"


def _folder() -> Traversable:
    return resources.files("toolfleet.broker").joinpath(LUA_FOLDER)


@functools.cache
def lua_names() -> frozenset[str]:
    """The name of every script there is (its file name less ``.lua``)."""
    return frozenset(
        entry.name.removesuffix(".lua")
        for entry in _folder().iterdir()
        if entry.name.endswith(".lua")
    )


@functools.cache
def lua_source(name: str) -> str:
    """The text of script ``name``, read from its file once per process."""
    if name not in lua_names():
        raise ConfigurationError(
            f"no Lua script named {name!r}: toolfleet/broker/lua/ holds "
            f"{', '.join(sorted(lua_names()))}; name one of these, or add {name}.lua there"
        )
    return _folder().joinpath(f"{name}.lua").read_text(encoding="utf-8")


class _BlockingRun(Script):
    """redis-py's blocking Script (EVALSHA, SCRIPT LOAD on NOSCRIPT, pipelines load it before
    they run), bound to no client: every run names its client."""

    def __init__(self, source: str, sha: str) -> None:
        self.registered_client = None  # type: ignore[assignment]
        self.script = source
        self.sha = sha


class _AsyncRun(AsyncScript):
    """The asyncio twin of :class:`_BlockingRun`."""

    def __init__(self, source: str, sha: str) -> None:
        self.registered_client = None  # type: ignore[assignment]
        self.script = source
        self.sha = sha


class LuaScript:
    """One script of ``toolfleet/broker/lua/``, ready to run on any client."""

    __slots__ = ("_async", "_blocking", "name", "sha", "source")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        self._async = _AsyncRun(source, self.sha)
        self._blocking = _BlockingRun(source, self.sha)

    def run(self, client: Any, keys: Sequence[Any], args: Iterable[Any]) -> Any:
        """Run on an asyncio client (await the answer) or queue on its pipeline (await it
        too: it queues, and the pipeline's execute() answers)."""
        return self._async(keys=keys, args=args, client=client)

    def run_blocking(self, client: Any, keys: Sequence[Any], args: Iterable[Any]) -> Any:
        """Run on a blocking client, or queue on its pipeline."""
        return self._blocking(keys=keys, args=args, client=client)


@functools.cache
def lua_script(name: str) -> LuaScript:
    """Script ``name``, read and hashed once per process; ConfigurationError for a name with no
    file."""
    return LuaScript(name, lua_source(name))
