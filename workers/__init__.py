"""The worker side of toolfleet: Celery app, execute task, asyncio pool, tool registry."""

from __future__ import annotations

from typing import Any

from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import ENV_PREFIX, Settings
from toolfleet.workers.registry import Registry, registry, tool

__all__ = ["ENV_PREFIX", "Keys", "Registry", "Settings", "create_app", "registry", "tool"]


def __getattr__(name: str) -> Any:
    # Lazy: importing toolfleet.workers.app builds its module-level app from the environment, which
    # a tool module doing `from workers import tool` must not pay for.
    if name == "create_app":
        from toolfleet.workers.app import create_app

        return create_app
    raise AttributeError(f"module 'workers' has no attribute {name!r}")
