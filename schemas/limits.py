"""Fleet-wide controls a tool declares: its rate limit, its concurrency cap, and what they
count per (``@tool(rate_limit="20/s", max_concurrency=4, limit_key="tenant")``).

The declarations and the words for them live here, where workers and dispatchers both read
them; the worker enforces them in Redis before the tool runs (``toolfleet.workers.limits``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from toolfleet.schemas.errors import ConfigurationError

__all__ = [
    "BRANCH_KEY",
    "DEFAULT_LIMIT_WAIT_S",
    "SESSION_KEY",
    "LimitScope",
    "RateLimit",
    "limit_fields",
    "limit_scope",
    "limit_wait_of",
    "retry_after_text",
]

# How long a call over its tool's limit waits on the worker before it ends FAILED
# RateLimitedError, when neither CallParams nor the message says (CallParams.limit_wait_s).
DEFAULT_LIMIT_WAIT_S = 30.0
# The limit_key values that name the call's own branch or session, not one of its arguments.
BRANCH_KEY = "branch"
SESSION_KEY = "session"
# A scope value longer than this is hashed in its Redis key (the model's text, not a key).
_MAX_SCOPE_CHARS = 100
# How much of an argument's value an error message shows.
_SHOWN_CHARS = 60

_PERIODS: dict[str, float] = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([a-z]+)\s*$")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``count`` calls per ``period_s`` seconds, as written (``text``: "20/s", "100/m")."""

    count: float
    period_s: float
    text: str

    @classmethod
    def parse(cls, value: str) -> RateLimit:
        """``"N/s"``, ``"N/m"`` or ``"N/h"`` (N > 0); ValueError saying how to write it."""
        match = _RATE.match(value.lower()) if isinstance(value, str) else None
        period_s = _PERIODS.get(match.group(2)) if match else None
        if match is None or period_s is None or not float(match.group(1)) > 0:
            raise ConfigurationError(
                f"rate_limit must be 'N/s', 'N/m' or 'N/h' with N > 0 (calls per second, "
                f"minute or hour), got {value!r}"
            )
        return cls(float(match.group(1)), period_s, value.strip())

    @property
    def per_second(self) -> float:
        return self.count / self.period_s

    @property
    def burst(self) -> float:
        """The bucket's size: one second's worth of calls, and never less than one call."""
        return max(1.0, self.per_second)


@dataclass(frozen=True, slots=True)
class LimitScope:
    """What one call's limits count per: ``value`` (in the Redis keys) and ``shown`` (in an
    error a model reads, e.g. ``tenant 'acme'``; empty for a tool-wide limit)."""

    value: str
    shown: str

    def phrase(self) -> str:
        """`` for tenant 'acme'``, or nothing for a tool-wide limit."""
        return f" for {self.shown}" if self.shown else ""


def limit_scope(
    limit_key: str | None,
    arguments: dict[str, Any],
    *,
    branch_id: str | None,
    session_id: str | None,
) -> LimitScope:
    """The scope of one call: the whole tool (no ``limit_key``), its branch, its session (a
    branch without a session is its own session), or one argument's value."""
    if limit_key is None:
        return LimitScope("*", "")
    if limit_key == BRANCH_KEY:
        raw: Any = branch_id or ""
    elif limit_key == SESSION_KEY:
        raw = session_id or branch_id or ""
    else:
        raw = arguments.get(limit_key)
    text = raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True, default=str)
    shown = text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
    value = text
    if len(text) > _MAX_SCOPE_CHARS:
        value = "sha256:" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()
    return LimitScope(f"{limit_key}={value}", f"{limit_key} {shown!r}")


def limit_fields(tool: Any, limit_wait_s: float, session_id: str | None) -> dict[str, Any]:
    """The CallMessage fields the worker needs to hold ``tool``'s limits (a Tool); none for
    a tool without limits, whose message stays as it always was."""
    if not tool.limited:
        return {}
    fields: dict[str, Any] = {"limit_wait_s": limit_wait_s}
    if tool.limit_key == SESSION_KEY:
        fields["session_id"] = session_id
    return fields


def limit_wait_of(limit_wait_s: float | None) -> float:
    """A message's limit wait: its own, else :data:`DEFAULT_LIMIT_WAIT_S`."""
    return DEFAULT_LIMIT_WAIT_S if limit_wait_s is None else limit_wait_s


def retry_after_text(seconds: float) -> str:
    """``"0.4"``: seconds rounded up to a tenth (never "0"), as an error message says it."""
    return f"{max(0.1, math.ceil(seconds * 10 - 1e-9) / 10):g}"
