"""The Lua scripts that keep a call's started marker and terminal record consistent (C7).

Each exists once: the single-call store (:class:`toolfleet.workers.store.AsyncRecordStore`) runs
them one call at a time, the batch store (:class:`toolfleet.workers.bundle_store.BundleStore`) runs
the same scripts for a whole batch in one pipeline. (A call's start is two plain commands, not a
script: :func:`toolfleet.workers.store.queue_begin`.)
"""

from __future__ import annotations

from toolfleet.broker.lua_scripts import lua_script
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.wire import CallResult

__all__ = [
    "FINISH",
    "FINISH_SCRIPT",
    "RELEASE",
    "RELEASE_SCRIPT",
    "TAKE_OVER",
    "TAKE_OVER_SCRIPT",
    "finish_call",
]


# The scripts, as files of toolfleet/broker/lua/ (each file's header: its KEYS and ARGV),
# read once. FINISH writes a terminal record (the first of an attempt wins), RELEASE drops a
# started marker still ours, TAKE_OVER replaces a stale marker.
FINISH = lua_script("record_finish")
RELEASE = lua_script("record_release")
TAKE_OVER = lua_script("record_take_over")
FINISH_SCRIPT = FINISH.source
RELEASE_SCRIPT = RELEASE.source
TAKE_OVER_SCRIPT = TAKE_OVER.source


def finish_call(
    keys: Keys, result: CallResult, reply_to: str | None, ttl_s: int
) -> tuple[list[str], list[str | int]]:
    """FINISH_SCRIPT's keys and arguments for recording ``result``."""
    call_id = result.call_id
    return (
        [keys.event(call_id), keys.started(call_id), reply_to or ""],
        [result.model_dump_json(), result.attempt, ttl_s],
    )
