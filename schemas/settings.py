"""The one typed settings object, read from ``TOOLFLEET_*`` environment variables."""

from __future__ import annotations

import difflib
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.model import ToolfleetModel
from toolfleet.schemas.redis_url import SENTINEL_EXAMPLE, is_sentinel, parse_sentinel

__all__ = ["ENV_PREFIX", "Settings", "check_broker_url", "masked_url"]

ENV_PREFIX = "TOOLFLEET_"


class Settings(ToolfleetModel):
    """Everything a worker or a dispatcher needs to find the fleet and run calls.

    Each field ``name`` is read from ``TOOLFLEET_<NAME>``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # None means "embedded": toolfleet starts a private Redis and local workers itself.
    broker_url: str | None = None
    # Celery's own result backend; off by default because the call record in Redis
    # (under key_prefix) is the result. Set it to have AsyncResult(call_id) work too.
    result_backend: str | None = None
    tools: tuple[str, ...] = ()
    key_prefix: str = "toolfleet"
    sync_queue: str = "toolfleet.sync"
    async_queue: str = "toolfleet.async"
    sync_prefetch: int = Field(default=1, ge=1)
    async_prefetch: int = Field(default=4, ge=1)
    # Must exceed the longest tool timeout, or Redis redelivers calls still running.
    visibility_timeout_s: float = Field(default=3600.0, gt=0)
    # C8: calls of one act() in flight at once when call_params.max_in_flight is unset.
    max_in_flight: int = Field(default=256, ge=1)
    max_argument_bytes: int = Field(default=1_000_000, ge=1)
    record_ttl_s: int = Field(default=7 * 24 * 3600, ge=1)
    # With no live worker on a call's queue for this long, its queued calls fail
    # NoWorkerError and are revoked; 0 waits forever (a fleet that scales up from zero).
    no_worker_timeout_s: float = Field(default=60.0, ge=0)
    # A call found nowhere (in no queue, not reserved, not started, no record) twice this far
    # apart is republished once; found nowhere twice again, it fails CallLostError.
    reconcile_grace_s: float = Field(default=5.0, gt=0)
    # How long history writes are retried, and calls awaited, through a broker outage.
    outage_limit_s: float = Field(default=120.0, gt=0)
    # The same for a broker not reached yet (by this Fleet, or a starting worker): one that has
    # never answered is most likely a wrong URL or a Redis not started, not an outage.
    connect_limit_s: float = Field(default=10.0, gt=0)
    # Where the embedded default keeps its Redis socket, logs and Flower state.
    run_dir: str | None = None
    # Task events (Flower's view of each call) cost a PUBLISH per event: "monitor" sends them
    # only while a monitor renews its enable_events lease; "always" sends them unconditionally.
    task_events: Literal["monitor", "always"] = "monitor"
    # How long one enable_events broadcast keeps a worker's task events on (Flower renews
    # every 5 s); after the monitor leaves, events turn off within this many seconds.
    monitor_lease_s: float = Field(default=30.0, gt=0)
    # The primary's name in the sentinels' "sentinel monitor <name> ..." line; required with a
    # sentinel:// broker URL (toolfleet.schemas.redis_url).
    sentinel_master: str | None = None
    # Call records and history count as written only once this many replicas acknowledge
    # them (WAIT after each such write; docs/reliability.md); 0 never waits.
    replica_acks: int = Field(default=0, ge=0)

    @field_validator("broker_url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        # Checked here, so `http://…` or `127.0.0.1:6379` is one line naming the setting on
        # every command instead of a redis-py or kombu traceback from deep inside.
        if url is None or url == "":
            return None
        return check_broker_url(url)

    @model_validator(mode="after")
    def _sentinel_needs_master(self) -> Settings:
        if is_sentinel(self.broker_url) and not self.sentinel_master:
            raise ConfigurationError(
                f"{ENV_PREFIX}BROKER_URL is a Sentinel URL but {ENV_PREFIX}SENTINEL_MASTER is "
                f"unset; set {ENV_PREFIX}SENTINEL_MASTER to the name in the sentinels' "
                f"'sentinel monitor <name> ...' line (e.g. {ENV_PREFIX}SENTINEL_MASTER=mymaster)"
            )
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``TOOLFLEET_*`` variables; ``overrides`` win over the environment."""
        env = os.environ if environ is None else environ
        _warn_unknown(env, {ENV_PREFIX + name.upper() for name in cls.model_fields})
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None or raw == "":
                continue
            values[name] = _split_list(raw) if name == "tools" else raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            if not err["loc"]:  # a rule across settings: its message names them
                raise ConfigurationError(str(err["msg"]).removeprefix("Value error, ")) from None
            field = str(err["loc"][0])
            var = ENV_PREFIX + field.upper()
            message = str(err["msg"]).removeprefix("Value error, ")
            shown = masked_url(values.get(field)) if field.endswith("_url") else values.get(field)
            raise ConfigurationError(
                f"{var}={shown!r} is invalid: {message}; fix or unset {var}"
            ) from None

    def key(self, *parts: str) -> str:
        """A Redis key under this fleet's prefix."""
        return ":".join((self.key_prefix, *parts))

    def queue_for(self, kind: str | None) -> str:
        """The queue of a ``kind`` tool's calls (``Tool.kind``) and of a ``--kind`` worker:
        the asyncio pool's for "async", the prefork pool's for anything else."""
        return self.async_queue if kind == "async" else self.sync_queue


_HOST_SCHEMES = ("redis", "rediss")
_SOCKET_SCHEMES = ("redis+socket", "socket")
_URL_EXAMPLE = (
    "redis://host:6379/0, rediss://host:6380/0, redis+socket:///path/to/redis.sock or "
    f"{SENTINEL_EXAMPLE}"
)


_Shown = TypeVar("_Shown")
# A URL's userinfo: everything between "scheme://" and the last "@" before the host's end.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#]*)@")
# A password passed as a query parameter (redis-py reads ``?password=``).
_PASSWORD_PARAM = re.compile(r"(?P<name>[?&]password=)[^&#\s]*", re.IGNORECASE)


def masked_url(value: _Shown) -> _Shown:
    """``value`` with the password of every URL in it as ``***`` (``redis://:***@host/0``):
    a URL, or a text that holds URLs (an error message, a log line). The one masking of
    toolfleet: every broker URL an error, a log line, a record or a result shows goes
    through it. Anything but a string is returned as it is."""
    if not isinstance(value, str) or ("@" not in value and "password=" not in value.lower()):
        return value

    def hide(match: re.Match[str]) -> str:
        user, colon, _password = match["userinfo"].partition(":")
        return f"{match['scheme']}{user}:***@" if colon else match[0]

    shown = _USERINFO.sub(hide, value)
    return _PASSWORD_PARAM.sub(lambda m: f"{m['name']}***", shown)  # type: ignore[return-value]


def check_broker_url(url: str) -> str:
    """``url`` if it is a Redis URL toolfleet can use, else ValueError saying what to write."""
    if is_sentinel(url):
        parse_sentinel(url)  # ValueError naming what is wrong
        return url
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number in 0..65535
    except ValueError as exc:
        raise ConfigurationError(f"not a valid URL ({exc}); write {_URL_EXAMPLE}") from None
    scheme = parts.scheme.lower()
    if scheme in _HOST_SCHEMES:
        if not parts.hostname:
            raise ConfigurationError(f"{scheme}:// URL names no host; write {_URL_EXAMPLE}")
        if port == 0:
            raise ConfigurationError(f"port 0 is not a port; write {_URL_EXAMPLE}")
        return url
    if scheme in _SOCKET_SCHEMES:
        if not parts.path:
            raise ConfigurationError(f"{scheme}:// URL names no socket path; write {_URL_EXAMPLE}")
        return url
    shown = f"scheme {parts.scheme + '://'!r}" if parts.scheme else "no scheme"
    raise ConfigurationError(f"the broker must be Redis, got {shown}; write {_URL_EXAMPLE}")


def _split_list(raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


# TOOLFLEET_* names that are not settings: the compose file's image tag, the tests' own.
_NOT_SETTINGS = ("TOOLFLEET_IMAGE", "TOOLFLEET_TEST_")


def _warn_unknown(env: Mapping[str, str], known: set[str]) -> None:
    """A misspelled variable would otherwise be ignored in silence; name it and the fix."""
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var in known or var.startswith(_NOT_SETTINGS):
            continue
        close = difflib.get_close_matches(var, sorted(known), n=1)
        hint = f"did you mean {close[0]}?" if close else f"the settings are {sorted(known)}"
        warnings.warn(f"{var} is not a toolfleet setting and is ignored; {hint}", stacklevel=3)
