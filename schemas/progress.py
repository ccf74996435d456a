"""A tool's progress report as it crosses the broker.

A worker pushes each report onto the reply list of the dispatcher that asked for progress
(:attr:`toolfleet.schemas.wire.CallMessage.progress`), the list its collector already pops
results from (``Keys.reply``). A report is ``{"progress": {...}}``: the only entry of that list
that does not start with ``{"call_id"``, so the collector tells the two apart by their first
bytes, and an entry of either kind is ordered against the other: every report a call sent
before its result is popped before that result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import ConfigDict, ValidationError

from toolfleet.schemas.errors import ConfigurationError, WrongTypeError
from toolfleet.schemas.model import ToolfleetModel

__all__ = [
    "MESSAGE_MAX_CHARS",
    "PROGRESS_PREFIX",
    "CallProgress",
    "ProgressReport",
    "check_progress",
    "decode",
    "encode",
    "is_progress",
]

PROGRESS_PREFIX = b'{"progress":'
# A report's message is cut to this many characters (a progress line, not a payload).
MESSAGE_MAX_CHARS = 1000


class ProgressReport(ToolfleetModel):
    """One report of one call attempt, as the tool made it."""

    model_config = ConfigDict(extra="ignore")  # a newer worker may say more

    call_id: str
    attempt: int = 0
    function: str
    # An int stays an int (progress(1, total=6) reaches the listener as 1 of 6, not 1.0).
    done: int | float
    total: int | float | None = None
    message: str | None = None
    # 1, 2, ... per attempt, in the order the tool reported (throttling skips numbers).
    seq: int
    # When the tool reported it (epoch seconds, the worker's clock).
    at: float


def encode(report: ProgressReport) -> str:
    return '{"progress":' + report.model_dump_json() + "}"


def is_progress(raw: bytes | str) -> bool:
    """Whether a reply-list entry is a progress report (else it is a CallResult)."""
    if isinstance(raw, str):
        return raw.startswith('{"progress":')
    return raw.startswith(PROGRESS_PREFIX)


def decode(raw: bytes | str) -> ProgressReport | None:
    """The report in a reply-list entry; None when it is not one that can be read."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    body = text.removeprefix('{"progress":').removesuffix("}")
    try:
        return ProgressReport.model_validate_json(body)
    except ValidationError:
        return None


def check_progress(
    done: object, total: object = None, message: object = None
) -> tuple[int | float, int | float | None, str | None]:
    """The arguments of ``current_call().progress()`` checked: ``done`` and ``total`` finite
    numbers (not bools; an int stays an int), ``message`` a string (cut to
    :data:`MESSAGE_MAX_CHARS`)."""
    number = _number("done", done)
    whole = None if total is None else _number("total", total)
    if message is not None and not isinstance(message, str):
        raise WrongTypeError(
            f"progress(message=...) must be a str or None, got {type(message).__name__}"
        )
    text = message[:MESSAGE_MAX_CHARS] if message is not None else None
    return number, whole, text


def _number(name: str, value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WrongTypeError(f"progress({name}=...) must be a number, got {type(value).__name__}")
    if isinstance(value, int):
        return int(value)  # an IntEnum or int subclass as its plain value
    number = float(value)
    if not math.isfinite(number):
        raise ConfigurationError(f"progress({name}=...) must be finite, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class CallProgress:
    """One progress report of a running call, as a progress callback receives it."""

    call_id: str
    tool: str
    done: float
    total: float | None
    message: str | None
    attempt: int = 0
    # When the tool reported it (epoch seconds, the worker's clock).
    reported_at: float = 0.0
