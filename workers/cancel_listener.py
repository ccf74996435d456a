"""C9 on the asyncio pool: cancel a running call when its call id arrives on the fleet's cancel
channel (``Keys.cancel_channel()``), which the dispatcher publishes to."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from toolfleet.broker.redis_url import async_client
from toolfleet.schemas.keys import Keys
from toolfleet.workers.runtime import WorkerRuntime

__all__ = ["listen_for_cancels"]

logger = logging.getLogger("celery.worker.aio_pool")

# Backoff between reconnects of the cancel-channel subscriber.
_RESUBSCRIBE_DELAY_S = 1.0


async def listen_for_cancels(runtime: WorkerRuntime, cancel: Callable[[str], None]) -> None:
    """Call ``cancel(call_id)`` for each call id published on the cancel channel, until
    cancelled; a lost connection is re-opened after a short backoff."""
    channel = Keys(runtime.settings.key_prefix).cancel_channel()
    while True:
        client = async_client(runtime.redis_url)
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(channel)
                async for item in pubsub.listen():
                    if item.get("type") != "message":
                        continue
                    data = item.get("data")
                    cancel(data.decode() if isinstance(data, bytes) else str(data))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("cancel-channel subscriber lost its connection: %r", exc)
            await asyncio.sleep(_RESUBSCRIBE_DELAY_S)
        finally:
            await client.aclose()
