"""Whether a Fleet has ever reached its broker, and so how long its silence is waited out.

An outage is a broker that was reachable: it may come back any moment, so enqueueing, parking a
call for approval and history writes are retried through it for ``TOOLFLEET_OUTAGE_LIMIT_S``
(two minutes by default). A broker this Fleet has never reached is most likely a wrong URL or a
Redis not started yet: the same retries end within ``TOOLFLEET_CONNECT_LIMIT_S`` (10 s by
default), then each call of the batch ends ABORTED with a BrokerError that names the masked URL
and the setting to check, as ``toolfleet worker`` and every command do.

A Fleet has reached its broker once anything of it got an answer: a publish, or the broker watch
of any of its loops (which asks as soon as the loop first uses the fleet, then twice a second).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from toolfleet.broker.outage import OutageRetry
from toolfleet.schemas.errors import BrokerError
from toolfleet.schemas.settings import ENV_PREFIX, Settings, masked_url

__all__ = ["BrokerContact"]

T = TypeVar("T")


class BrokerContact:
    """One Fleet's contact with its broker: reached yet or not, and the retry limit that follows."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # Set once, never cleared: after the first answer, silence is an outage.
        self.reached = False

    def answered(self) -> None:
        """Something of this Fleet got an answer from the broker."""
        self.reached = True

    @property
    def limit_s(self) -> float:
        """How long an operation is retried while the broker does not answer."""
        settings = self._settings
        if self.reached:
            return settings.outage_limit_s
        return min(settings.connect_limit_s, settings.outage_limit_s)

    def limit_text(self) -> str:
        """The setting behind :attr:`limit_s`, with its value, for a message."""
        settings = self._settings
        by_outage = self.reached or settings.outage_limit_s < settings.connect_limit_s
        name = "OUTAGE_LIMIT_S" if by_outage else "CONNECT_LIMIT_S"
        return f"{ENV_PREFIX}{name}={self.limit_s:g}s"

    async def retry(
        self,
        operation: Callable[[], Awaitable[T]],
        *,
        retry_if: Callable[[BaseException], bool],
        on_retry: Callable[[BaseException, OutageRetry], None],
    ) -> T:
        """``await operation()``, tried again while it fails with an error ``retry_if`` accepts
        (the broker is unreachable) and :attr:`limit_s` has not passed (the one outage policy,
        toolfleet.broker.outage); an answer marks the broker reached.

        Before the broker was ever reached the limit is a promise to the caller: no try starts
        that could not end within it (the longest try so far tells), and the last error becomes
        :meth:`unreached_error`."""
        retry = OutageRetry(self.limit_s)
        longest_s = 0.0
        while True:
            started = time.monotonic()
            try:
                result = await operation()
            except Exception as exc:
                longest_s = max(longest_s, time.monotonic() - started)
                if not retry_if(exc):
                    raise
                never_reached = not self.reached
                if retry.left_s <= (longest_s + retry.next_pause_s if never_reached else 0.0):
                    if never_reached:
                        raise self.unreached_error(exc) from exc
                    raise
                on_retry(exc, retry)
                await retry.pause()
                continue
            self.answered()
            return result

    def unreached_error(self, error: BaseException) -> BrokerError:
        """The error of each call given up on because the broker never answered (``error``:
        the last failure, a BrokerError whose cause is the connection error)."""
        cause = error.__cause__ if error.__cause__ is not None else error
        return BrokerError(
            f"the broker {masked_url(str(self._settings.broker_url))} never answered this "
            f"Fleet within {self.limit_text()} ({type(cause).__name__}: "
            f"{masked_url(str(cause))}); check that Redis is running there and that "
            f"{ENV_PREFIX}BROKER_URL points at it"
        )
