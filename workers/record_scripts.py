"""The Lua scripts that keep a call's started marker and terminal record consistent (C7).

Each exists once: the single-call store (:class:`toolfleet.workers.store.AsyncRecordStore`) runs
them one call at a time, the batch store (:class:`toolfleet.workers.bundle_store.BundleStore`) runs
the same scripts for a whole batch in one pipeline. (A call's start is two plain commands, not a
script: :func:`toolfleet.workers.store.queue_begin`.)
"""

from __future__ import annotations

from toolfleet.schemas.keys import Keys
from toolfleet.schemas.wire import CallResult

__all__ = ["FINISH_SCRIPT", "RELEASE_SCRIPT", "TAKE_OVER_SCRIPT", "finish_call"]


# KEYS: event, started, reply list ("" for none). ARGV: record JSON, attempt, ttl seconds.
# SET ... GET writes and reads the previous record in one command (the common case,
# no earlier record, costs no separate GET); the rare loser puts the winner's record back.
FINISH_SCRIPT = """
local current = redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3], 'GET')
if current then
  local ok, decoded = pcall(cjson.decode, current)
  local attempt = ok and type(decoded) == 'table' and tonumber(decoded['attempt']) or 0
  if attempt >= tonumber(ARGV[2]) then
    redis.call('SET', KEYS[1], current, 'EX', ARGV[3])
    return 0
  end
end
redis.call('DEL', KEYS[2])
if KEYS[3] ~= '' then
  redis.call('RPUSH', KEYS[3], ARGV[1])
  redis.call('EXPIRE', KEYS[3], ARGV[3])
end
return 1
"""


RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


# Takes over the started marker only while it is absent, unreadable or still stale.
TAKE_OVER_SCRIPT = """
local current = redis.call('GET', KEYS[1])
if current then
  local ok, data = pcall(cjson.decode, current)
  local beat_at = ok and type(data) == 'table' and tonumber(data['beat_at'])
  if beat_at and beat_at > tonumber(ARGV[2]) - tonumber(ARGV[3]) then
    return current
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[4])
return 1
"""


def finish_call(
    keys: Keys, result: CallResult, reply_to: str | None, ttl_s: int
) -> tuple[list[str], list[str | int]]:
    """FINISH_SCRIPT's keys and arguments for recording ``result``."""
    call_id = result.call_id
    return (
        [keys.event(call_id), keys.started(call_id), reply_to or ""],
        [result.model_dump_json(), result.attempt, ttl_s],
    )
