"""A cancellation that reaches a redis-py asyncio command is never lost on the way.

redis-py sends each command (and each pipeline) through ``asyncio.wait_for(send,
socket_timeout)`` when the client has a socket timeout, as every toolfleet client does. On
Python 3.11 ``wait_for`` drops a cancellation that arrives in the loop turn in which the send
finishes: it returns the send's result, the command reads its reply, and the task runs on as
if nothing had asked it to stop (fixed in CPython 3.12, whose ``wait_for`` is built on
``asyncio.timeout``). A caller that blocked its own event loop for a moment lines every task
up on the same turns, and ``asyncio.run``'s single final cancel then missed an act() waiting
for approval, which went on polling its parked call for the hour of its approval time.

So every asyncio client of :mod:`toolfleet.broker.redis_url` sends through a connection that
compares its task's pending cancellation requests (``Task.cancelling()``, which stays counted
however a cancel was caught) before and after the send, and raises the one the send dropped.
The connection is dropped first: its reply is never read, so it must not serve another command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection

__all__ = ["keep_cancellations"]

# One subclass per redis-py connection class (TCP, TLS, Unix socket, Sentinel-managed).
_KEEPING: dict[type[AbstractConnection], type[AbstractConnection]] = {}


class _KeepsCancellation(AbstractConnection):
    """Mixed in before a redis-py connection class: a send never swallows a cancellation."""

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        task = asyncio.current_task()
        requested = task.cancelling() if task is not None else 0
        await super().send_packed_command(command, check_health)
        if task is not None and task.cancelling() > requested:
            await self.disconnect(nowait=True)
            raise asyncio.CancelledError


def _keeping(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    if issubclass(connection_class, _KeepsCancellation):
        return connection_class
    keeping = _KEEPING.get(connection_class)
    if keeping is None:
        name = f"CancellationKeeping{connection_class.__name__}"
        keeping = type(name, (_KeepsCancellation, connection_class), {})
        _KEEPING[connection_class] = keeping
    return keeping


def keep_cancellations(client: Any) -> Any:
    """``client`` (a ``redis.asyncio.Redis``), its future connections made cancellation-safe.

    Called on a client that has no connection yet (redis-py connects on first use), so every
    connection it ever makes is of the safe class."""
    pool: aioredis.ConnectionPool = client.connection_pool
    pool.connection_class = _keeping(pool.connection_class)
    return client
