"""The dispatcher's reconciler: no awaited call waits forever for a message that is gone.

One background task per Fleet (next to its collector and broker watch). Every published call
is tracked with the dispatcher's own copy of its message until its result arrives. Each tick:

* **No worker for a queue.** A queue with awaited calls and no live consumer
  (``toolfleet.workers.presence``) is warned about at once, naming the queue and the command that
  starts a worker for it. After ``no_worker_timeout_s`` (0 = never) with still none, its calls that
  no worker recorded fail with a NoWorkerError naming the queue; the batch records them FAILED first
  and revokes them.
* **Lost calls.** Calls published more than ``reconcile_grace_s`` ago and
  without a record are located (:mod:`toolfleet.dispatcher.watch.whereabouts`). One found finished
  is delivered; one found *nowhere* twice in a row, a grace period apart (so a message in transit is
  not misjudged), is republished once from the dispatcher's copy: safe, because C7 makes the call_id
  an idempotency key. Found nowhere twice again, it fails with a CallLostError naming where it was
  last seen. A started call whose worker died follows the worker-lost rules.

It also keeps ``Keys.dispatcher(id)`` alive, so ``toolfleet status`` can tell a batch whose
dispatcher is gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from toolfleet.broker.liveness import live_since
from toolfleet.dispatcher.infra.stopping import cancel_and_wait, raise_if_cancelled
from toolfleet.dispatcher.watch.collector import Collector
from toolfleet.dispatcher.watch.whereabouts import NowhereTwice, Place, Sighting, locate
from toolfleet.schemas.errors import CallLostError, NoWorkerError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage, CallResult

__all__ = ["DISPATCHER_TTL_S", "TICK_S", "Attempt", "Reconciler", "start_command"]

log = logging.getLogger(__name__)

TICK_S = 1.0
# The dispatcher's liveness key outlives a few missed ticks, not a dead process.
DISPATCHER_TTL_S = 15
# At most this many calls are located per tick; the rest wait for the next tick.
_LOCATE_CHUNK = 2000

Publish = Callable[[Sequence[tuple[CallMessage, Tool]]], Awaitable[None]]


def start_command(settings: Settings, queue: str) -> str:
    """The command that starts a worker consuming ``queue``."""
    kind = "async" if queue == settings.async_queue else "sync"
    default = Settings.model_fields[f"{kind}_queue"].default
    prefix = "" if queue == default else f"TOOLFLEET_{kind.upper()}_QUEUE={queue} "
    return f"{prefix}toolfleet worker --kind {kind}"


@dataclass(slots=True)
class Attempt:
    """One published attempt and what the reconciler knows of it."""

    message: CallMessage
    tool: Tool
    queue: str
    published_s: float
    republished: bool = False
    nowhere: NowhereTwice = field(default_factory=NowhereTwice)
    last_seen: str | None = None
    last_seen_s: float = 0.0

    def where_last_seen(self, now_s: float) -> str:
        if self.last_seen is None:
            return f"never seen since it was published to queue {self.queue!r}"
        return f"last seen {self.last_seen} {now_s - self.last_seen_s:.0f}s ago"


class Reconciler:
    """Tracks published calls and acts on the ones no worker serves or the broker lost."""

    def __init__(
        self,
        client: aioredis.Redis,
        collector: Collector,
        keys: Keys,
        settings: Settings,
        dispatcher_id: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.collector = collector
        self.keys = keys
        self.settings = settings
        # How the tracked calls were published, so a lost one goes out again the same way
        # (given with each published(): the sending step is above this one).
        self._publish: Publish | None = None
        self.dispatcher_id = dispatcher_id
        self._clock = clock
        self._tracked: dict[tuple[str, int], Attempt] = {}
        # queue -> when its calls were first seen with no live worker (None: one is there).
        self._unserved_since: dict[str, float] = {}
        self._checked: set[str] = set()  # queues looked at once (later, each tick looks)
        self._task: asyncio.Task[None] | None = None
        self._looked_s = float("-inf")

    # -- tracking ----------------------------------------------------------------------

    def queue_of(self, tool: Tool) -> str:
        return self.settings.queue_for(tool.kind)

    async def published(
        self, calls: Sequence[tuple[CallMessage, Tool]], *, republish: Publish
    ) -> None:
        """Track calls now on the broker (``republish`` sends a lost one again); warn at once
        about a queue nobody consumes."""
        self._publish = republish
        now = self._clock()
        queues: set[str] = set()
        for message, tool in calls:
            queue = self.queue_of(tool)
            queues.add(queue)
            self._tracked[(message.call_id, message.attempt)] = Attempt(message, tool, queue, now)
        fresh = [q for q in queues if q not in self._checked]
        if fresh:
            try:
                await self._check_served(fresh)
            except (RedisError, OSError) as exc:
                log.debug("reconciler: presence check failed: %s", exc)

    def broker_restarted(self) -> None:
        """A broker restart drops the messages its consumers had popped but not yet recorded
        as reserved (kombu's window), so a call republished once may be lost again through no
        fault of its own: each restart earns every tracked call one more republish (C7 keeps a
        duplicate harmless)."""
        for tracked in self._tracked.values():
            tracked.republished = False
            tracked.nowhere.reset()

    @property
    def tracked(self) -> int:
        return len(self._tracked)

    # -- the loop ----------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"toolfleet-reconciler:{self.dispatcher_id}"
            )

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        try:
            async with asyncio.timeout(2):
                await self.client.delete(self.keys.dispatcher(self.dispatcher_id))
        except (RedisError, OSError, TimeoutError):
            pass  # the key expires by itself
        await self.client.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except (RedisError, OSError) as exc:
                raise_if_cancelled()
                log.debug("reconciler: broker unreachable (%s); the broker watch reports it", exc)
            except Exception:
                raise_if_cancelled()
                log.exception("reconciler %s: unexpected error; continuing", self.dispatcher_id)
            raise_if_cancelled()  # also when tick() caught the cancel itself
            await asyncio.sleep(TICK_S)

    async def tick(self) -> None:
        await self.client.set(self.keys.dispatcher(self.dispatcher_id), "1", ex=DISPATCHER_TTL_S)
        self._prune()
        if not self._tracked:
            self._unserved_since.clear()
            return
        queues = {t.queue for t in self._tracked.values()}
        await self._check_served(sorted(queues))
        self._fail_unserved()
        await self._reconcile()

    def _prune(self) -> None:
        for key in [k for k in self._tracked if not self.collector.is_awaited(*k)]:
            del self._tracked[key]

    # -- a queue with no worker --------------------------------------------------------

    async def _check_served(self, queues: Sequence[str]) -> None:
        since = live_since()
        async with self.client.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.zcount(self.keys.workers(queue), since, "+inf")
            counts = await pipe.execute()
        now = self._clock()
        self._checked.update(queues)
        for queue, count in zip(queues, counts, strict=True):
            if int(count) > 0:
                if self._unserved_since.pop(queue, None) is not None:
                    log.warning("a worker now consumes queue %r; its calls will run", queue)
                continue
            if queue not in self._unserved_since:
                self._unserved_since[queue] = now
                timeout_s = self.settings.no_worker_timeout_s
                limit = (
                    f"its calls fail with NoWorkerError after {timeout_s:g}s "
                    "(TOOLFLEET_NO_WORKER_TIMEOUT_S)"
                    if timeout_s > 0
                    else "its calls wait until one starts (TOOLFLEET_NO_WORKER_TIMEOUT_S=0)"
                )
                log.warning(
                    "no live worker consumes queue %r; start one with `%s`; %s",
                    queue,
                    start_command(self.settings, queue),
                    limit,
                )

    def _fail_unserved(self) -> None:
        timeout_s = self.settings.no_worker_timeout_s
        if timeout_s <= 0:
            return
        now = self._clock()
        for queue, since in list(self._unserved_since.items()):
            if now - since < timeout_s:
                continue
            doomed = [k for k, t in self._tracked.items() if t.queue == queue]
            for call_id, attempt in doomed:
                tracked = self._tracked.pop((call_id, attempt))
                self.collector.fail(
                    call_id,
                    attempt,
                    NoWorkerError(
                        f"call {call_id} of tool {tracked.message.function!r} waited "
                        f"{now - since:.0f}s on queue {queue!r}, which no live worker "
                        f"consumes (TOOLFLEET_NO_WORKER_TIMEOUT_S={timeout_s:g}); it was "
                        f"revoked. Start a worker with `{start_command(self.settings, queue)}`"
                    ),
                )
            if doomed:
                log.warning(
                    "queue %r: %d call(s) failed with NoWorkerError after %gs without a worker",
                    queue,
                    len(doomed),
                    timeout_s,
                )

    # -- lost calls --------------------------------------------------------------------

    async def _reconcile(self) -> None:
        now = self._clock()
        grace_s = self.settings.reconcile_grace_s
        # A look reads whole queues: take one every half grace period, not every tick.
        if now - self._looked_s < grace_s / 2:
            return
        self._looked_s = now
        due = [
            (key, t)
            for key, t in self._tracked.items()
            if now - t.published_s >= grace_s and t.queue not in self._unserved_since
        ][:_LOCATE_CHUNK]
        if not due:
            return
        sightings = await locate(
            self.client,
            self.keys,
            [key[0] for key, _ in due],
            {t.queue for _, t in due},
        )
        republish: list[Attempt] = []
        for key, tracked in due:
            sighting = sightings[key[0]]
            if sighting.place == Place.FINISHED:
                self._finished(key, tracked, sighting)
            elif tracked.nowhere.saw(sighting.place, now, grace_s):
                if tracked.republished:
                    self._lost(key, tracked)
                else:
                    republish.append(tracked)
            elif sighting.place != Place.NOWHERE:
                tracked.last_seen = sighting.describe()
                tracked.last_seen_s = now
        if republish:
            await self._republish(republish)

    def _finished(self, key: tuple[str, int], tracked: Attempt, sighting: Sighting) -> None:
        assert sighting.record is not None
        try:
            result = CallResult.model_validate_json(sighting.record)
        except ValueError:
            return
        # The record holds the latest attempt; an older one is not this wait's answer.
        if result.attempt >= key[1]:
            self.collector.deliver(sighting.record)

    async def _republish(self, calls: list[Attempt]) -> None:
        publish = self._publish
        if publish is None:  # nothing tracked was published: there is nothing to send again
            return
        log.warning(
            "reconciler: %d call(s) found nowhere twice %gs apart (in no queue, not reserved, "
            "not started, no record); republishing them once: %s",
            len(calls),
            self.settings.reconcile_grace_s,
            ", ".join(t.message.call_id for t in calls[:5]) + (" ..." if len(calls) > 5 else ""),
        )
        await publish([(t.message, t.tool) for t in calls])
        now = self._clock()
        for tracked in calls:
            tracked.republished = True
            tracked.nowhere.reset()
            tracked.published_s = now

    def _lost(self, key: tuple[str, int], tracked: Attempt) -> None:
        del self._tracked[key]
        message = tracked.message
        self.collector.fail(
            key[0],
            key[1],
            CallLostError(
                f"call {message.call_id} of tool {message.function!r} was lost twice: its "
                f"message is in no queue, reserved by no worker, not started and has no "
                f"record, both before and after the dispatcher republished it; "
                f"{tracked.where_last_seen(self._clock())}. It was not run by any "
                f"worker that recorded it; check the workers' logs and re-run it if needed"
            ),
        )
        log.error("reconciler: call %s lost twice; failed with CallLostError", message.call_id)
