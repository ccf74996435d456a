"""Riding out a broker outage: the one retry policy of workers and dispatchers.

Redis restarting, or a network blip, must not fail a call that a retry a moment later would
carry: an operation that fails because the broker is unreachable is tried again, after 0.2 s,
then after twice as long each time (at most 2 s apart), until ``Settings.outage_limit_s``
(``TOOLFLEET_OUTAGE_LIMIT_S``) has passed since its first try; then its last error stands. A
dispatcher enqueueing calls, a dispatcher writing history, and a worker starting or recording a
call all retry this way (:func:`through_outage`, or :class:`OutageRetry` where the loop is the
caller's own), with the one default limit, Settings'.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["FIRST_DELAY_S", "MAX_DELAY_S", "OutageRetry", "broker_unreachable", "through_outage"]

# The first retry waits this long; each later one twice as long as the one before, at most
# MAX_DELAY_S.
FIRST_DELAY_S = 0.2
MAX_DELAY_S = 2.0

T = TypeVar("T")


def broker_unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the broker could not be reached (a connection error or a
    timeout: worth a retry), not that it refused what it was sent."""
    return isinstance(error, RedisConnectionError | RedisTimeoutError | OSError)


class OutageRetry:
    """The retries of one operation through an outage of at most ``limit_s`` seconds, counted
    from when this object is made (the operation's first try)."""

    def __init__(self, limit_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_s
        self._clock = clock
        self._deadline = clock() + limit_s
        self._delay_s = FIRST_DELAY_S

    @property
    def left_s(self) -> float:
        """Seconds left before the limit (0 once it has passed)."""
        return max(0.0, self._deadline - self._clock())

    @property
    def next_pause_s(self) -> float:
        """How long :meth:`pause` would wait now."""
        return min(self._delay_s, self.left_s)

    async def pause(self) -> bool:
        """Wait before the next try (never past the limit); False, without waiting, once the
        limit has passed: give up."""
        left_s = self.left_s
        if left_s <= 0:
            return False
        await asyncio.sleep(min(self._delay_s, left_s))
        self._delay_s = min(self._delay_s * 2, MAX_DELAY_S)
        return True


async def through_outage(
    operation: Callable[[], Awaitable[T]],
    limit_s: float,
    *,
    retry_if: Callable[[BaseException], bool] = broker_unreachable,
    on_retry: Callable[[BaseException, OutageRetry], None] | None = None,
) -> T:
    """``await operation()``, tried again while it fails with an error ``retry_if`` accepts
    and ``limit_s`` has not passed; raises the last error. ``on_retry(error, retry)`` is told
    of each failure that is retried (to log it)."""
    retry = OutageRetry(limit_s)
    while True:
        try:
            return await operation()
        except Exception as exc:
            if not retry_if(exc) or retry.left_s <= 0:
                raise
            if on_retry is not None:
                on_retry(exc, retry)
            if not await retry.pause():
                raise
