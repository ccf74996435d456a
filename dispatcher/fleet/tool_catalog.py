"""What the workers announced about their tools (toolfleet.workers.tool_catalog), as one
fleet remembers it: the secret argument names of tools this dispatcher has not imported, so
a call of one is recorded with those values hidden."""

from __future__ import annotations

import json
import logging
from collections.abc import Container, Iterable
from typing import Any

import redis.asyncio as aioredis

from toolfleet.schemas.keys import Keys

__all__ = ["ToolCatalog"]

log = logging.getLogger(__name__)


class ToolCatalog:
    """The announced secret argument names of the tools a fleet's registry lacks."""

    def __init__(self, registry: Container[Any]) -> None:
        self._registry = registry
        self._announced: dict[str, frozenset[str]] = {}

    async def learn(self, client: aioredis.Redis, keys: Keys, functions: Iterable[Any]) -> None:
        """Read what the workers announced about the tools named in ``functions`` that the
        registry lacks and no earlier read found; never raises (unknown means hide every
        value)."""
        missing = sorted(
            {
                f
                for f in functions
                if isinstance(f, str)
                and f not in self._announced
                and _encodable(f)
                and f not in self._registry
            }
        )
        if not missing:
            return
        try:
            found = await client.hmget(keys.tool_secrets(), missing)
        except Exception as exc:  # a broker problem fails the calls elsewhere, not here
            log.debug("fleet: tool catalog unreadable: %r", exc)
            return
        for name, raw in zip(missing, found, strict=True):
            try:
                names = json.loads(raw) if raw is not None else None
            except ValueError:
                continue
            if isinstance(names, list):
                self._announced[name] = frozenset(str(n) for n in names)

    def secret_args(self, function: Any) -> frozenset[str] | None:
        """The secret argument names announced for ``function``, or None when none was."""
        return self._announced.get(function) if isinstance(function, str) else None


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
