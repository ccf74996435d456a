"""Each worker announces, in Redis, the secret argument names of every tool it runs.

A dispatcher that has not imported a tool refuses its calls (UnknownToolError) and must record
them without leaking a secret. Without the tool it cannot tell which argument is secret, so it
hides every value, unless the fleet's workers announced the tool: then it hides exactly the
announced secret arguments and keeps the rest readable. One HSET per worker
start, in ``Keys.tool_secrets()``; tools only ever gain entries (a worker with an older
version of a tool overwrites it with what it runs).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis
from celery import Celery, signals

from toolfleet.broker.redis_url import sync_client
from toolfleet.schemas.keys import Keys
from toolfleet.workers.app_info import redis_url_of, registry_of, settings_of
from toolfleet.workers.app_signals import connect as connect_signal

__all__ = ["announce_tools", "register_tool_catalog"]

log = logging.getLogger(__name__)


def announce_tools(app: Celery, client: Any) -> int:
    """HSET each registered tool's secret argument names; returns how many tools."""
    tools = {
        name: json.dumps(sorted(registry_of(app).get(name).secret_args))
        for name in registry_of(app).names()
    }
    if tools:
        client.hset(Keys(settings_of(app).key_prefix).tool_secrets(), mapping=tools)
    return len(tools)


def register_tool_catalog(app: Celery) -> None:
    """Announce the worker's tools once it is ready (its tool modules are loaded by then)."""

    def announce(sender: Any = None, **_: Any) -> None:
        client = sync_client(redis_url_of(app), socket_timeout=5)
        try:
            announce_tools(app, client)
        except redis.RedisError as exc:  # the presence beat reports a broker that is gone
            log.warning("toolfleet worker: could not announce its tools: %s", exc)
        finally:
            client.close()

    connect_signal(app, signals.worker_ready, announce)
