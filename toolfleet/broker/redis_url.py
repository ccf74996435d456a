"""Every redis-py client toolfleet builds from a broker URL is built here.

A broker URL is ``redis://``/``rediss://`` (a host), ``unix://`` (a socket: kombu's
``redis+socket://`` spelled the redis-py way) or ``sentinel://h1:26379;sentinel://h2:26379``
(Redis Sentinel: the sentinels to ask, ``;``-separated, as kombu spells it; the first one may
carry ``:password@`` and ``/db`` for the primary). A Sentinel URL only works with the name of
the primary the sentinels watch (``TOOLFLEET_SENTINEL_MASTER``): schemas.sentinel_url folds
that name into the URL toolfleet passes around internally (``?master_name=``), so a client of
it (:func:`sync_client`, :func:`async_client`, :func:`async_pooled_client`) asks the sentinels
for the current primary before each new connection and follows a failover by itself. For any
other URL these are ``from_url`` with the caller's options, unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel as sync_sentinel
from redis.exceptions import TimeoutError as RedisTimeoutError

from toolfleet.broker.client_settings import client_settings, set_client_settings
from toolfleet.broker.redis_cancel import keep_cancellations
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.sentinel_url import (
    SentinelTarget,
    is_sentinel,
    parse_sentinel,
)

__all__ = [
    "REPLICA_WAIT_MS",
    "async_client",
    "async_pooled_client",
    "check_sentinel_master",
    "replica_acks_of",
    "require_replica_acks",
    "sentinel_views",
    "sync_client",
    "wait_for_replicas",
    "wait_for_replicas_sync",
]


def _target(url: str) -> SentinelTarget:
    target = parse_sentinel(url)
    if not target.master:
        raise ConfigurationError(
            "the broker is a Sentinel URL but no primary name is set; set "
            "TOOLFLEET_SENTINEL_MASTER to the name in the sentinels' 'sentinel monitor <name> "
            "...' line (e.g. TOOLFLEET_SENTINEL_MASTER=mymaster)"
        )
    return target


def _sentinel_options(options: dict[str, Any]) -> dict[str, Any]:
    # The sentinels are asked with the caller's socket options (timeouts, keepalive).
    return {k: v for k, v in options.items() if k.startswith("socket_")}


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A blocking client of the broker at ``url``: for a Sentinel URL, of its current primary
    (found again after a failover), else ``redis.Redis.from_url(url, **options)``."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **options)
    client: redis.Redis = _primary_of(sync_sentinel.Sentinel, url, options)
    return client


def async_client(url: str, **options: Any) -> aioredis.Redis:
    """The asyncio twin of :func:`sync_client`, whose commands never swallow a cancellation
    (:mod:`toolfleet.broker.redis_cancel`)."""
    if not is_sentinel(url):
        return keep_cancellations(aioredis.Redis.from_url(url, **options))
    client: aioredis.Redis = _primary_of(async_sentinel.Sentinel, url, options)
    return keep_cancellations(client)


def _primary_of(sentinel_class: Any, url: str, options: dict[str, Any]) -> Any:
    """A client of the primary the sentinels of ``url`` name, asked again on each new
    connection (redis-py's ``master_for``), with the caller's options."""
    target = _target(url)
    manager = sentinel_class(list(target.sentinels), sentinel_kwargs=_sentinel_options(options))
    return manager.master_for(str(target.master), **target.primary_options(), **options)


class _BlockingSentinelPool(async_sentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """A Sentinel-managed pool whose callers wait for a free connection past the limit."""


def async_pooled_client(url: str, *, max_connections: int, timeout: float) -> aioredis.Redis:
    """An asyncio client shared by many coroutines: at most ``max_connections`` connections,
    a caller past them waits up to ``timeout`` seconds for one (a blocking pool)."""
    if not is_sentinel(url):
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout
        )
        return keep_cancellations(aioredis.Redis(connection_pool=pool))
    options = {"max_connections": max_connections, "timeout": timeout}
    client: aioredis.Redis = _primary_of(
        async_sentinel.Sentinel, url, {"connection_pool_class": _BlockingSentinelPool, **options}
    )
    return keep_cancellations(client)


def sentinel_views(url: str, *, timeout_s: float = 2.0) -> list[dict[str, Any]]:
    """Each sentinel's view of the primary: its address, quorum, how many other sentinels
    and replicas it knows, its flags; ``error`` for a sentinel that did not answer, and
    ``known`` (the names it monitors) for one that does not know the primary."""
    target = parse_sentinel(url)
    views: list[dict[str, Any]] = []
    for host, port in target.sentinels:
        view: dict[str, Any] = {"sentinel": f"{host}:{port}"}
        client = redis.Redis(
            host=host, port=port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        try:
            masters: dict[str, Any] = client.sentinel_masters()  # type: ignore[assignment]
        except redis.RedisError as exc:
            view["error"] = str(exc) or type(exc).__name__
        else:
            state = masters.get(target.master) if target.master else None
            if state is None:
                view["known"] = sorted(str(name) for name in masters)
            else:
                view.update(
                    primary=f"{state.get('ip')}:{state.get('port')}",
                    quorum=int(state.get("quorum", 0)),
                    sentinels=int(state.get("num-other-sentinels", 0)) + 1,
                    replicas=int(state.get("num-slaves", 0)),
                    flags=str(state.get("flags", "")),
                )
        finally:
            client.close()
        views.append(view)
    return views


def check_sentinel_master(url: str, *, timeout_s: float = 2.0) -> None:
    """ConfigurationError when the sentinels answer but none monitors the primary named in
    ``url``; silent when one does, or when none answers (an outage, not a wrong setting)."""
    if not is_sentinel(url):
        return
    target = _target(url)
    views = sentinel_views(url, timeout_s=timeout_s)
    answered = [v for v in views if "error" not in v]
    if not answered or any("primary" in v for v in answered):
        return
    known = sorted({name for v in answered for name in v.get("known", [])})
    asked = ", ".join(v["sentinel"] for v in answered)
    raise ConfigurationError(
        f"the sentinels at {asked} monitor no primary named {target.master!r} (they monitor: "
        f"{', '.join(known) or 'nothing'}); set TOOLFLEET_SENTINEL_MASTER to the name in their "
        f"'sentinel monitor <name> ...' line"
    )


# How long one WAIT blocks for the replicas (TOOLFLEET_REPLICA_ACKS); a shortfall is a
# redis TimeoutError, retried like any outage.
REPLICA_WAIT_MS = 1000


def require_replica_acks(client: Any, replicas: int) -> Any:
    """Keep for ``client`` (:mod:`toolfleet.broker.client_settings`, not on the client): its
    writes of records and history count as written only once ``replicas`` replicas
    acknowledge them (Settings.replica_acks); returns ``client``."""
    return set_client_settings(client, replace(client_settings(client), replica_acks=replicas))


def replica_acks_of(client: Any) -> int:
    """The replicas a write on ``client`` must reach (0: none asked for)."""
    return client_settings(client).replica_acks


def _shortfall(acked: Any, replicas: int) -> None:
    if int(acked) < replicas:
        raise RedisTimeoutError(
            f"{int(acked)} of {replicas} replica(s) acknowledged the write within "
            f"{REPLICA_WAIT_MS} ms (TOOLFLEET_REPLICA_ACKS={replicas})"
        )


async def wait_for_replicas(client: aioredis.Redis, replicas: int) -> None:
    """Return once ``replicas`` replicas hold every write the primary made before this call
    (on any connection: PING sets WAIT's offset to the primary's current one), else raise a
    redis TimeoutError after REPLICA_WAIT_MS. No round trip when ``replicas`` is 0."""
    if replicas <= 0:
        return
    async with client.pipeline(transaction=False) as pipe:
        pipe.ping()
        pipe.wait(replicas, REPLICA_WAIT_MS)
        _ping, acked = await pipe.execute()
    _shortfall(acked, replicas)


def wait_for_replicas_sync(client: redis.Redis, replicas: int) -> None:
    """The blocking twin of :func:`wait_for_replicas`."""
    if replicas <= 0:
        return
    with client.pipeline(transaction=False) as pipe:
        pipe.ping()
        pipe.wait(replicas, REPLICA_WAIT_MS)
        _ping, acked = pipe.execute()
    _shortfall(acked, replicas)
