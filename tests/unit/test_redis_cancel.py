"""Every asyncio client toolfleet builds sends through a connection that keeps a cancellation
(toolfleet.broker.redis_cancel); the test that it does keep one, with a real program, is
tests/integration/test_blocked_loop_exit.py."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelManagedConnection

from toolfleet.broker.redis_cancel import _KeepsCancellation
from toolfleet.broker.redis_url import async_client, async_pooled_client
from toolfleet.schemas.sentinel_url import with_master

URLS = {
    "redis://127.0.0.1:1/0": None,
    "rediss://127.0.0.1:1/0": SSLConnection,
    "unix:///tmp/nothing-listens.sock": UnixDomainSocketConnection,
    with_master("sentinel://127.0.0.1:1", "mymaster"): SentinelManagedConnection,
}


@pytest.mark.parametrize("url", list(URLS))
def test_every_async_client_keeps_cancellations(url: str) -> None:
    for client in (
        async_client(url, socket_timeout=60),
        async_pooled_client(url, max_connections=2, timeout=1),
    ):
        connection_class = client.connection_pool.connection_class
        assert issubclass(connection_class, _KeepsCancellation), connection_class
        base = URLS[url]
        if base is not None:
            assert issubclass(connection_class, base), connection_class


def test_the_safe_class_is_made_once_per_connection_class() -> None:
    first = async_client("redis://127.0.0.1:1/0").connection_pool.connection_class
    again = async_client("redis://127.0.0.1:1/1").connection_pool.connection_class
    assert first is again
