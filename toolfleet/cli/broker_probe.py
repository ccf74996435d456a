"""Is the configured broker there? Asked once, up front, so a wrong ``TOOLFLEET_BROKER_URL``
is a one-line error naming it instead of minutes of Celery reconnect attempts. And how many
calls wait on its queues, as kombu counts them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from kombu.exceptions import ChannelError

from toolfleet.broker.redis_url import check_sentinel_master, sync_client
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import ENV_PREFIX, masked_url

__all__ = ["check_reachable", "queue_depths"]


def check_reachable(
    redis_url: str, broker_url: str | None = None, *, timeout_s: float = 2.0
) -> None:
    """PING ``redis_url``; ConfigurationError naming the (masked) broker URL if it is silent."""
    client = sync_client(redis_url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except redis.RedisError as exc:
        check_sentinel_master(redis_url, timeout_s=timeout_s)  # a wrong primary name
        shown = masked_url(broker_url or redis_url)
        raise ConfigurationError(
            f"the broker {shown} does not answer ({exc}); check that it is running, or fix "
            f"{ENV_PREFIX}BROKER_URL"
        ) from None
    finally:
        client.close()


def queue_depths(app: Any, queues: Sequence[str]) -> dict[str, int]:
    """How many messages wait on each of ``queues`` of ``app``'s broker, as kombu counts them
    (a passive ``queue_declare``, every priority); a queue holding none counts 0."""
    depths: dict[str, int] = {}
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        for queue in queues:
            try:
                declared = channel.queue_declare(queue=queue, passive=True)
            except ChannelError:  # NOT_FOUND: kombu's Redis transport keeps no empty queue
                depths[queue] = 0
            else:
                depths[queue] = int(declared.message_count)
    return depths
