"""What a toolfleet Celery app carries: the Settings it was built from, its tool registry, the
Redis URL of its broker (where call records are kept), and whether a monitor watches its fleet.

A leaf module: the task, pool, monitor and presence modules read an app through it, so none
of them imports :mod:`toolfleet.workers.app`, which imports them all.
"""

from __future__ import annotations

from celery import Celery

from toolfleet.broker.liveness import MonitorWatch
from toolfleet.schemas.sentinel_url import with_master
from toolfleet.schemas.settings import Settings
from toolfleet.workers.registry import Registry

__all__ = [
    "DEFAULT_BROKER_URL",
    "monitor_watch_of",
    "redis_url_from",
    "redis_url_of",
    "registry_of",
    "settings_of",
]

DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"


def settings_of(app: Celery) -> Settings:
    """The Settings an app was created from."""
    settings: Settings = app.toolfleet_settings
    return settings


def registry_of(app: Celery) -> Registry:
    """The tool registry an app's workers execute from."""
    reg: Registry = app.toolfleet_registry
    return reg


def monitor_watch_of(app: Celery) -> MonitorWatch | None:
    """Whether a monitor watches ``app``'s fleet, as both publishing paths of a dispatcher
    ask it (one cached answer per app); None for an app toolfleet did not build."""
    watch: MonitorWatch | None = getattr(app, "toolfleet_monitor_watch", None)
    return watch


def redis_url_of(app: Celery) -> str:
    """The redis-py URL of the app's broker, where call records are kept (a Sentinel URL
    carries its primary's name: build clients of it with toolfleet.broker.redis_url)."""
    settings: Settings | None = getattr(app, "toolfleet_settings", None)
    master = settings.sentinel_master if settings is not None else None
    return redis_url_from(str(app.conf.broker_url), master)


def redis_url_from(broker_url: str | None, sentinel_master: str | None = None) -> str:
    """The redis-py URL of a broker URL as Settings and kombu spell it (None: the default),
    with the primary's name folded into a Sentinel URL."""
    url = with_master(broker_url or DEFAULT_BROKER_URL, sentinel_master)
    # kombu spells a unix socket redis+socket:///path; redis-py spells it unix:///path.
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://") :]
    if url.startswith("socket://"):
        return "unix://" + url[len("socket://") :]
    return url
