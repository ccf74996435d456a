"""The batch journal: what an act() batch is, written before it runs.

Before anything of a batch reaches Redis (its first enqueued call, or its first history unit
when every call is refused before enqueue), the dispatcher stores under ``Keys.batch(id)``
the batch id, branch id, strategy, the dispatcher's id and every call's call_id, function and
arguments, in input order, with every secret argument value replaced by ``REDACTED`` (and
every value, when the tool is unknown). ``Keys.open_batches()`` lists the batches not yet fully
written. As the batch writes its history it advances ``written``: the number of calls, from
the start of the input, whose units are in the history; that counter is set in the same
script as the units it counts, and the script that writes the last unit closes the batch. So
``toolfleet recover`` knows exactly which units are still missing, and recovering twice
writes nothing twice.

The journal costs no round trip of its own. It rides in the first publish's
pipeline, ahead of the messages (:class:`JournalOpening`, :mod:`toolfleet.dispatcher.send.direct`),
and the close rides in the last history write (:mod:`toolfleet.dispatcher.history.durable`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from toolfleet.dispatcher.accept.envelope import Envelope
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.govern.session_signals import HistoryWriteFailed, Signal
from toolfleet.dispatcher.history.durable import DurableLog
from toolfleet.schemas.errors import InternalError, MalformedRequestError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.record import bounded_arguments, shown_arguments
from toolfleet.workers.registry import Registry

__all__ = [
    "JOURNAL_WRITE_TIMEOUT_S",
    "BatchJournal",
    "JournalCall",
    "JournalEntry",
    "JournalOpening",
    "close_journal",
    "journal_calls",
    "journal_commands",
    "load_journal",
    "open_batches",
    "progress_key",
    "write_journal",
]

log = logging.getLogger(__name__)

# The journal is written before the first enqueue; a broker too slow for this fails the
# enqueue too, so the batch goes on without waiting longer (the calls report the broker).
JOURNAL_WRITE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class JournalCall:
    """One call of a batch as the journal keeps it: never a secret value."""

    call_id: str
    function: str
    arguments: dict[str, Any]
    tool_call_id: str = ""


@dataclass(slots=True)
class JournalEntry:
    batch_id: str
    branch_id: str
    strategy: str
    dispatcher_id: str
    calls: list[JournalCall]
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> JournalEntry:
        data = json.loads(raw)
        calls = [JournalCall(**c) for c in data.pop("calls")]
        return cls(calls=calls, **data)


def journal_calls(
    items: Sequence[Envelope | MalformedRequestError],
    call_ids: Sequence[str],
    registry: Registry,
    announced: Callable[[Any], frozenset[str] | None] | None = None,
) -> list[JournalCall]:
    """The journal's view of a batch's calls: tool secrets redacted, a tool this dispatcher
    lacks redacted as its workers ``announced`` or else every value, a malformed request as
    an empty call."""
    calls: list[JournalCall] = []
    for item, call_id in zip(items, call_ids, strict=True):
        if isinstance(item, MalformedRequestError):
            calls.append(JournalCall(call_id, "", {}, item.tool_call_id or ""))
            continue
        secret: frozenset[str] | None = None  # unknown: every value hidden
        if item.function in registry:
            secret = registry.get(item.function).secret_args
        elif announced is not None:
            secret = announced(item.function)  # the workers' word on which are secret
        if isinstance(item.arguments, dict):
            # Bounded: a call too large to send is refused, and its journal entry (kept as
            # long as the batch) must not hold the refused payload.
            public = bounded_arguments(shown_arguments(item.arguments, secret))
        else:
            public = bounded_arguments(item.arguments, secret) if item.arguments else {}
        calls.append(JournalCall(call_id, item.function, public, item.tool_call_id or ""))
    return calls


def progress_key(keys: Keys, batch_id: str) -> str:
    """String: how many calls of the batch, from the start, have their unit in the history."""
    return keys.batch(batch_id) + ":written"


def journal_commands(pipe: Any, keys: Keys, entry: JournalEntry, *, ttl_s: int) -> None:
    """Add the journal's write to ``pipe`` (a pipeline without MULTI)."""
    # No MULTI, to save a round trip per batch. The entry goes first, so an open listing never
    # names a batch whose journal is missing; a failure part way leaves an unlisted entry that
    # expires, exactly like a journal that failed to write (the batch runs without one).
    # ``written`` is reset, not left absent: a batch id seen before (ids from a seeded random,
    # as under hypothesis) must not inherit an old count and skip its history.
    pipe.set(keys.batch(entry.batch_id), entry.to_json(), ex=ttl_s)
    pipe.set(progress_key(keys, entry.batch_id), 0, ex=ttl_s)
    pipe.hset(keys.open_batches(), entry.batch_id, entry.branch_id)


async def write_journal(
    client: aioredis.Redis, keys: Keys, entry: JournalEntry, *, ttl_s: int
) -> None:
    """The journal's write on its own: one round trip."""
    async with client.pipeline(transaction=False) as pipe:
        journal_commands(pipe, keys, entry, ttl_s=ttl_s)
        await pipe.execute()


async def close_journal(client: aioredis.Redis, keys: Keys, batch_id: str) -> None:
    """The batch is fully written: no longer listed as open (the journal itself stays)."""
    await client.hdel(keys.open_batches(), batch_id)


async def load_journal(
    client: aioredis.Redis, keys: Keys, batch_id: str
) -> tuple[JournalEntry, int] | None:
    """The journal of ``batch_id`` and how many of its calls are written, or None."""
    raw, written = await client.mget([keys.batch(batch_id), progress_key(keys, batch_id)])
    if raw is None:
        return None
    return JournalEntry.from_json(raw), int(written or 0)


async def open_batches(client: aioredis.Redis, keys: Keys) -> list[tuple[str, str, bool]]:
    """Every open batch as ``(batch_id, branch_id, dispatcher_alive)``."""
    listed = await client.hgetall(keys.open_batches())
    found: list[tuple[str, str, bool]] = []
    for raw_batch, raw_branch in sorted(listed.items()):
        batch_id, branch_id = _text(raw_batch), _text(raw_branch)
        raw = await client.get(keys.batch(batch_id))
        if raw is None:
            await client.hdel(keys.open_batches(), batch_id)  # expired: nothing to recover
            continue
        dispatcher_id = json.loads(raw).get("dispatcher_id", "")
        alive = bool(await client.exists(keys.dispatcher(dispatcher_id)))
        found.append((batch_id, branch_id, alive))
    return found


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class JournalOpening:
    """The journal's write, sent once, ahead of the batch's first effect in Redis.

    The first publish of the batch carries it in its own pipeline, ahead of the messages
    (:mod:`toolfleet.dispatcher.send.direct`: one connection, run in order, no round trip of its
    own); a history write that comes first (every call refused before enqueue) sends it alone
    (:meth:`ensure`). Whoever sends it, everyone else waits until it is settled, so nothing of the
    batch reaches Redis before its journal: no message, no unit, no written count.
    """

    def __init__(self, keys: Keys, entry: JournalEntry, ttl_s: int) -> None:
        self._keys = keys
        self.batch_id = entry.batch_id
        # Dropped once settled: a big batch's journal (every call's arguments) must not live
        # as long as the batch (the memory target: 100,000 calls, < 250 MB).
        self.entry: JournalEntry | None = entry
        self._ttl_s = ttl_s
        self.claimed = False
        self._settled: asyncio.Future[None] | None = None

    def claim(self) -> bool:
        """True for the one caller that is to send the journal (then it must :meth:`settle`)."""
        if self.claimed:
            return False
        self.claimed = True
        self._settled = asyncio.get_running_loop().create_future()
        return True

    def add_to(self, pipe: Any) -> None:
        journal_commands(pipe, self._keys, self._unsent(), ttl_s=self._ttl_s)

    def _unsent(self) -> JournalEntry:
        if self.entry is None:
            raise InternalError(f"batch {self.batch_id}: its journal was already settled")
        return self.entry

    def settle(self, error: BaseException | None) -> None:
        """The claimed write ended: written (``error`` None) or not (the batch runs without)."""
        if self._settled is None or self._settled.done():
            return
        if error is not None:
            log.warning("batch %s: journal not written (%r); running without", self.batch_id, error)
        self.entry = None
        self._settled.set_result(None)

    async def wait(self) -> None:
        """Until a claimed write is settled (at once when unclaimed or settled)."""
        if self._settled is not None and not self._settled.done():
            await asyncio.shield(self._settled)

    async def ensure(self, client: aioredis.Redis) -> None:
        """Before a write of the batch's own: the journal sent alone if nobody has, else
        waited for."""
        if not self.claim():
            await self.wait()
            return
        await self.send_alone(client)

    async def send_alone(self, client: aioredis.Redis) -> None:
        """The claimer's write when it cannot ride in a publishing pipeline; then settled."""
        error: BaseException | None = None
        try:
            async with asyncio.timeout(JOURNAL_WRITE_TIMEOUT_S):
                await write_journal(client, self._keys, self._unsent(), ttl_s=self._ttl_s)
        except (RedisError, OSError, TimeoutError) as exc:
            error = exc
        except BaseException as exc:
            self.settle(exc)
            raise
        self.settle(error)


class BatchJournal:
    """One act() batch's journal: written before its first effect, closed once its history is in.

    ``durable`` is the branch history's log of unwritten units (drained before closing);
    ``signal`` receives the HistoryWriteFailed raised when it cannot be drained.
    """

    def __init__(
        self,
        fleet: Fleet,
        *,
        batch_id: str,
        branch_id: str,
        strategy: str,
        durable: DurableLog,
        signal: Callable[[Signal], None],
    ) -> None:
        self._fleet = fleet
        self.batch_id = batch_id
        self.branch_id = branch_id
        self.strategy = strategy
        self._durable = durable
        self._signal = signal
        self.progress_key = progress_key(fleet.keys, batch_id)
        self._finished = False
        self.opening: JournalOpening | None = None
        self._registered: dict[DurableLog, int] | None = None

    def start(
        self, items: Sequence[Envelope | MalformedRequestError], call_ids: Sequence[str]
    ) -> JournalOpening:
        """The journal's write, not yet sent: its first publish or history write sends it."""
        fleet = self._fleet
        entry = JournalEntry(
            batch_id=self.batch_id,
            branch_id=self.branch_id,
            strategy=self.strategy,
            dispatcher_id=fleet.collector_id,
            calls=journal_calls(items, call_ids, fleet.registry, fleet.announced_secret_args),
        )
        self.opening = JournalOpening(fleet.keys, entry, fleet.settings.record_ttl_s)
        # While the batch runs, a broker restart that loses the branch's history gets it back
        # from memory (toolfleet.dispatcher.watch.broker_watch).
        histories = fleet.histories
        histories[self._durable] = histories.get(self._durable, 0) + 1
        self._registered = histories
        return self.opening

    def _unregister(self) -> None:
        histories, self._registered = self._registered, None
        if histories is not None:
            left = histories.get(self._durable, 0) - 1
            if left > 0:
                histories[self._durable] = left
            else:
                histories.pop(self._durable, None)

    async def finish(self, *, closed_by_write: bool = False) -> None:
        """Wait (up to the outage limit) for the branch's unwritten history, then close.

        ``closed_by_write``: the history write that completed the batch closes the journal in
        its own script (toolfleet.dispatcher.history.durable), so once the history is in,
        the journal is closed and no HDEL of its own is sent. A journal never sent (nothing of the
        batch reached Redis) has nothing to close.
        """
        if self._finished:
            return
        self._finished = True
        fleet, durable = self._fleet, self._durable
        try:
            error = await durable.drain(
                fleet.redis,
                fleet.keys,
                fleet.settings.record_ttl_s,
                fleet.contact.limit_s,
                broker_reached=fleet.contact.reached,
            )
        finally:
            self._unregister()
        if error is not None:
            unwritten = durable.unwritten
            self._signal(
                HistoryWriteFailed(
                    None,
                    self.branch_id,
                    f"{unwritten} call(s) of batch {self.batch_id} still not in Redis after "
                    f"{fleet.contact.limit_text()} ({error}); "
                    f"the in-memory history has them; run `toolfleet recover "
                    f"{self.branch_id}` once Redis is back",
                    unwritten=unwritten,
                )
            )
            return
        if closed_by_write or self.opening is None or not self.opening.claimed:
            return
        await self.opening.wait()
        try:
            async with asyncio.timeout(JOURNAL_WRITE_TIMEOUT_S):
                await close_journal(fleet.redis, fleet.keys, self.batch_id)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("batch %s: journal not closed: %r", self.batch_id, exc)
