"""Is the configured broker there? Asked once, up front, so a wrong ``TOOLFLEET_BROKER_URL``
is a one-line error naming it instead of minutes of Celery reconnect attempts."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.settings import ENV_PREFIX

__all__ = ["check_reachable", "mask_url"]


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def check_reachable(
    redis_url: str, broker_url: str | None = None, *, timeout_s: float = 2.0
) -> None:
    """PING ``redis_url``; ConfigurationError naming the (masked) broker URL if it is silent."""
    client = redis.Redis.from_url(
        redis_url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        shown = mask_url(broker_url or redis_url)
        raise ConfigurationError(
            f"the broker {shown} does not answer ({exc}); check that it is running, or fix "
            f"{ENV_PREFIX}BROKER_URL"
        ) from None
    finally:
        client.close()
