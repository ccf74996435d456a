"""What a broker URL says: a Sentinel URL taken apart, and the primary's name folded into it.

A Sentinel URL is ``sentinel://h1:26379;sentinel://h2:26379`` (the sentinels to ask,
``;``-separated, as kombu spells it; the first one may carry ``:password@`` and ``/db`` for
the primary). Settings check it here; the clients of it are built in
:mod:`toolfleet.broker.redis_url`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from toolfleet.schemas.errors import ConfigurationError

__all__ = ["SENTINEL_EXAMPLE", "SentinelTarget", "is_sentinel", "parse_sentinel", "with_master"]

SENTINEL_EXAMPLE = (
    "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380 (each sentinel host:port, "
    "';'-separated; the first may carry :password@ and /db) with "
    "TOOLFLEET_SENTINEL_MASTER=<the name in 'sentinel monitor <name> ...'>"
)
_MASTER_PARAM = "master_name"
_DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelTarget:
    """A Sentinel URL taken apart: the sentinels, and how to reach the primary they name."""

    sentinels: tuple[tuple[str, int], ...]
    master: str | None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def primary_options(self) -> dict[str, Any]:
        found: dict[str, Any] = {"db": self.db}
        if self.username:
            found["username"] = self.username
        if self.password:
            found["password"] = self.password
        return found


def is_sentinel(url: str | None) -> bool:
    """Whether ``url`` is a Sentinel URL (``sentinel://...``)."""
    return bool(url) and str(url).lower().startswith("sentinel://")


def parse_sentinel(url: str) -> SentinelTarget:
    """The sentinels, primary name, db and credentials of a Sentinel URL; ValueError saying
    what to write when it is malformed."""
    sentinels: list[tuple[str, int]] = []
    master: str | None = None
    db, username, password = 0, None, None
    parts = [p.strip() for p in url.split(";") if p.strip()]
    if not parts:
        raise ConfigurationError(f"a Sentinel URL names no sentinel; write {SENTINEL_EXAMPLE}")
    for index, part in enumerate(parts):
        try:
            split = urlsplit(part)
            port = split.port
        except ValueError as exc:
            raise ConfigurationError(
                f"part {index + 1} is not a valid URL ({exc}); write {SENTINEL_EXAMPLE}"
            ) from None
        if split.scheme.lower() != "sentinel":
            raise ConfigurationError(
                f"every part of a Sentinel URL must be sentinel://host:port, got "
                f"{split.scheme + '://' if split.scheme else 'no scheme'} in part {index + 1}; "
                f"write {SENTINEL_EXAMPLE}"
            )
        if not split.hostname:
            raise ConfigurationError(f"part {index + 1} names no host; write {SENTINEL_EXAMPLE}")
        if port == 0:
            raise ConfigurationError(
                f"port 0 is not a port (part {index + 1}); write {SENTINEL_EXAMPLE}"
            )
        sentinels.append((split.hostname, port or _DEFAULT_SENTINEL_PORT))
        names = parse_qs(split.query).get(_MASTER_PARAM)
        if names and master is None:
            master = names[0]
        if index == 0:
            path = split.path.strip("/")
            if path and not path.isdigit():
                raise ConfigurationError(f"db {path!r} is not a number; write {SENTINEL_EXAMPLE}")
            db = int(path) if path else 0
            username = unquote(split.username) if split.username else None
            password = unquote(split.password) if split.password else None
    return SentinelTarget(tuple(sentinels), master, db, username, password)


def with_master(url: str, master: str | None) -> str:
    """The URL toolfleet passes around for a broker: a Sentinel URL with the primary's name
    in it (``?master_name=``), any other URL as it is."""
    if not is_sentinel(url) or not master:
        return url
    first, sep, rest = url.partition(";")
    joiner = "&" if "?" in first else "?"
    return f"{first}{joiner}{urlencode({_MASTER_PARAM: master})}{sep}{rest}"
