"""History writes that survive a broker outage, exactly once.

A chunk is the serialized units of one in-order run of a batch, plus the batch's written
count before and after it (:func:`toolfleet.dispatcher.history.journal.progress_key`). A script
appends the chunk's event records and messages and advances the count, atomically, and only when the
count shows the chunk is not in yet: a write whose reply was lost (Redis applied it, the socket
timed out) is retried without appending twice, and ``toolfleet recover`` racing a live dispatcher
cannot double a unit either.

A chunk that fails on a broker error stays in the backlog; later chunks queue behind it (input
order) and every write, and :meth:`DurableLog.drain` at the end of the batch, retries the
backlog first, until it is in or the outage limit passes.

A broker that restarts without its data (or, with ``appendfsync everysec``, without the last
second of it) loses history already written. :meth:`DurableLog.restore`, called by the broker
watch for every branch with a batch in flight, writes the branch's history as held in memory
back in place of what Redis has (one MULTI/EXEC: the lists are replaced, never doubled), and
the backlog follows it in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from toolfleet.broker.lua_scripts import lua_script
from toolfleet.broker.outage import OutageRetry, broker_unreachable
from toolfleet.broker.redis_url import replica_acks_of, wait_for_replicas
from toolfleet.dispatcher.infra.outage_log import outage_log
from toolfleet.schemas.keys import Keys

__all__ = ["APPEND_SCRIPT", "Chunk", "DurableLog", "Progress", "append_chunk", "replace_history"]

log = logging.getLogger(__name__)

# Appends one history chunk exactly once (its KEYS and ARGV: the file's header): one
# EVALSHA per write, the text sent again only when the server does not know it (a restart).
_APPEND = lua_script("history_append")
APPEND_SCRIPT = _APPEND.source

# Even past the outage limit, one more second for the history: the broker may be back.
_MIN_DRAIN_S = 1.0


class Progress(NamedTuple):
    """A batch's written count around one chunk
    (:func:`toolfleet.dispatcher.history.journal.progress_key`)."""

    key: str
    before: int
    after: int
    # (open-batches hash, batch id) when the chunk completes its batch: the write closes the
    # batch's journal too (toolfleet.dispatcher.history.journal), so closing costs no round trip of
    # its own.
    closes: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Chunk:
    """Serialized units of one run; ``progress``: the batch's count around it, or None."""

    events: list[str]
    messages: list[str]
    units: int
    first_call_id: str | None
    progress: Progress | tuple[str, int, int] | None = None


async def append_chunk(
    client: aioredis.Redis, keys: Keys, branch_id: str, chunk: Chunk, ttl_s: int
) -> bool:
    """Append one chunk unless it is in already; True when this call appended it."""
    progress = Progress(*chunk.progress) if chunk.progress is not None else Progress("", 0, 0)
    open_key, batch_id = progress.closes or ("", "")
    appended = await _APPEND.run(
        client,
        keys=[keys.events(branch_id), keys.history(branch_id), progress.key, open_key],
        args=[
            progress.before,
            progress.after,
            ttl_s,
            len(chunk.events),
            batch_id,
            *chunk.events,
            *chunk.messages,
        ],
    )
    return bool(appended)


# RPUSH arguments per command when a history is written again whole.
_PUSH_ITEMS = 500


async def replace_history(
    client: aioredis.Redis,
    keys: Keys,
    branch_id: str,
    events: list[str],
    messages: list[str],
    ttl_s: int,
) -> None:
    """Make the branch's event and message lists exactly ``events`` and ``messages`` (one
    MULTI/EXEC: a reader sees the old lists or the new ones, never a mix)."""
    async with client.pipeline(transaction=True) as pipe:
        for key, lines in ((keys.events(branch_id), events), (keys.history(branch_id), messages)):
            pipe.delete(key)
            for i in range(0, len(lines), _PUSH_ITEMS):
                pipe.rpush(key, *lines[i : i + _PUSH_ITEMS])
            if lines:
                pipe.expire(key, ttl_s)
        await pipe.execute()


class DurableLog:
    """One branch's pending history chunks, written in order, retried through outages."""

    def __init__(self, branch_id: str) -> None:
        self.branch_id = branch_id
        self._backlog: list[Chunk] = []
        self._lock = asyncio.Lock()
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self.last_error: str | None = None
        self.last_error_type: str | None = None  # its exception's class, for a span's status
        # What Redis should hold of this branch now: the (events, messages) lines the branch
        # holds in memory, less the backlog (BranchHistory sets it).
        self.in_redis: Callable[[], tuple[list[str], list[str]]] | None = None
        # The broker lost some of the history: it is written again before the backlog.
        self._restore_pending = False

    @property
    def unwritten(self) -> int:
        """Units not yet in Redis."""
        return sum(chunk.units for chunk in self._backlog)

    def backlog_lines(self) -> tuple[int, int]:
        """(events, messages) of the units not yet in Redis."""
        return (
            sum(len(chunk.events) for chunk in self._backlog),
            sum(len(chunk.messages) for chunk in self._backlog),
        )

    async def restore(self, client: aioredis.Redis, keys: Keys, ttl_s: int, *, lost: bool) -> bool:
        """After a broker restart: write the history held in memory back if the broker lost
        any of it (``lost``: it came back empty; otherwise its lists are measured). True when
        a rewrite was due; a rewrite the broker refuses stays due (the next write, or the
        batch's drain, retries it first)."""
        if self.in_redis is None:
            return False
        async with self._loop_lock():
            if not lost and not self._restore_pending:
                events, messages = self.in_redis()
                async with client.pipeline(transaction=False) as pipe:
                    pipe.llen(keys.events(self.branch_id))
                    pipe.llen(keys.history(self.branch_id))
                    n_events, n_messages = await pipe.execute()
                if n_events >= len(events) and n_messages >= len(messages):
                    return False
            self._restore_pending = True
            log.warning(
                "branch %s: the broker lost some of its history; writing it again from memory",
                self.branch_id,
            )
        await self.flush(client, keys, ttl_s)
        return True

    async def write(
        self, client: aioredis.Redis, keys: Keys, chunk: Chunk, ttl_s: int
    ) -> str | None:
        """Queue ``chunk`` behind any backlog and try to write it all; the error text if
        some is still unwritten (it stays queued), else None."""
        self._backlog.append(chunk)
        return await self.flush(client, keys, ttl_s)

    def _loop_lock(self) -> asyncio.Lock:
        # An asyncio.Lock that once waited belongs to that loop; a branch acted on from a
        # later loop (act_sync) gets a fresh one.
        loop = asyncio.get_running_loop()
        if self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    async def flush(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> str | None:
        async with self._loop_lock():
            while self._backlog or self._restore_pending:
                try:
                    if self._restore_pending:
                        if self.in_redis is not None:
                            events, messages = self.in_redis()
                            await replace_history(
                                client, keys, self.branch_id, events, messages, ttl_s
                            )
                        self._restore_pending = False
                        continue
                    await append_chunk(client, keys, self.branch_id, self._backlog[0], ttl_s)
                    # TOOLFLEET_REPLICA_ACKS: written once the replicas have it (a shortfall
                    # is retried like an outage; the append above is idempotent).
                    await wait_for_replicas(client, replica_acks_of(client))
                except (RedisError, OSError) as exc:
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    self.last_error_type = type(exc).__qualname__
                    if broker_unreachable(exc):
                        # Said once per outage, with a summary every few seconds.
                        outage_log(client).failing(
                            f"history {self.branch_id}", exc, unwritten=self.unwritten
                        )
                    else:
                        log.error(
                            "branch %s: history of %d call(s) not yet written to Redis (%s); "
                            "kept and retried in order",
                            self.branch_id,
                            self.unwritten,
                            self.last_error,
                        )
                    return self.last_error
                self._backlog.pop(0)
            if self.last_error is not None:
                outage_log(client).answering(f"history {self.branch_id}")
            self.last_error = self.last_error_type = None
            return None

    async def drain(
        self,
        client: aioredis.Redis,
        keys: Keys,
        ttl_s: int,
        limit_s: float,
        *,
        broker_reached: bool = True,
    ) -> str | None:
        """Retry the backlog until it is written or ``limit_s`` passes (the outage policy,
        toolfleet.broker.outage); the last error if units are still unwritten then, else
        None. An outage already under way counts against the limit: a batch whose calls
        waited out the outage does not wait a whole limit again for its history, only
        :data:`_MIN_DRAIN_S` more (none for a broker never reached: no outage to outlast)."""
        at_least_s = _MIN_DRAIN_S if broker_reached else 0.0
        limit_s = max(at_least_s, limit_s - outage_log(client).down_for_s())
        retry = OutageRetry(limit_s)
        while self._backlog or self._restore_pending:
            left_s = retry.left_s
            if left_s <= 0:
                return self.last_error or "the outage limit passed"
            try:
                async with asyncio.timeout(left_s):
                    error = await self.flush(client, keys, ttl_s)
            except TimeoutError:
                return self.last_error or f"no reply from Redis within {limit_s:g}s"
            if error is None:
                return None
            await retry.pause()
        return None
