"""Watches the broker for a restart or a long outage, so no batch waits forever.

Redis restarted without its data loses queued messages, unacked deliveries, started markers and
reply lists: a call in flight then never gets a result. The watch notices the restart (Redis's
``run_id`` changes), gives running calls a grace period to report to the new instance, then
looks up every call still awaited: a stored record is delivered, a call still queued, reserved
or started (a broker that kept its data) goes on, and a call found nowhere is failed with a
BrokerError naming the broker. A broker unreachable for longer than ``Settings.outage_limit_s``
(``TOOLFLEET_OUTAGE_LIMIT_S``) fails every awaited call the same way. The batch turns that error
into a FAILED record that is stored first (so no worker runs the call later) and revokes it.

History survives a restart too: at once (before the grace period) every branch with a batch in
flight gets back from memory what the broker lost of its history — all of it when the broker
came back empty, the missing tail when it kept its data but not the last writes (an
``appendfsync everysec`` broker whose machine crashed) — so every pair is in Redis when
``act()`` returns (toolfleet.dispatcher.history.durable.DurableLog.restore).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from toolfleet.dispatcher.infra.outage_log import outage_log
from toolfleet.dispatcher.infra.stopping import cancel_and_wait, raise_if_cancelled
from toolfleet.dispatcher.watch.collector import Collector
from toolfleet.dispatcher.watch.whereabouts import Place, locate
from toolfleet.schemas.errors import BrokerError
from toolfleet.schemas.keys import Keys
from toolfleet.schemas.settings import Settings, masked_url

__all__ = ["CHECK_INTERVAL_S", "RESTART_GRACE_S", "BrokerWatch", "KeptHistory"]


class KeptHistory(Protocol):
    """A branch history kept in memory while its batch runs (the history step's DurableLog):
    what a broker restart lost of it can be written again."""

    branch_id: str

    async def restore(
        self, client: aioredis.Redis, keys: Keys, ttl_s: int, *, lost: bool
    ) -> bool: ...


log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.5
# After a restart, running calls get this long to report to the new instance.
RESTART_GRACE_S = 3.0
# The broker mark is rewritten this often (and lives twice as long).
_MARK_REFRESH_S = 3600.0


class BrokerWatch:
    """One background task per Fleet (next to its collector) checking the broker's identity."""

    def __init__(
        self,
        client: aioredis.Redis,
        collector: Collector,
        keys: Keys,
        broker_url: str,
        *,
        pools: Sequence[aioredis.ConnectionPool] = (),
        clock: Callable[[], float] = time.monotonic,
        outage_limit_s: float | None = None,
        queues: Sequence[str] = (),
        on_restart: Callable[[], None] | None = None,
        histories: Callable[[], Iterable[KeptHistory]] = tuple,
        record_ttl_s: int | None = None,
        on_answer: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.collector = collector
        self.keys = keys
        self.broker_url = masked_url(broker_url)
        self._clock = clock
        # TOOLFLEET_OUTAGE_LIMIT_S; an outage shorter than this fails no call, a longer one
        # fails the awaited calls (the broker may never come back). None: Settings' default.
        self.outage_limit_s = (
            Settings().outage_limit_s if outage_limit_s is None else outage_limit_s
        )
        # The queues a restart is checked against: a broker that kept its data (appendonly)
        # still holds the queued and reserved messages, and those calls are not lost.
        self.queues = tuple(queues)
        self.on_restart = on_restart  # told of each restart (the reconciler: see there)
        self.on_answer = on_answer  # told of each answer (the fleet's first contact: see there)
        # Branch histories with a batch in flight, given back what a restart lost of them.
        self.histories = histories
        self.record_ttl_s = Settings().record_ttl_s if record_ttl_s is None else record_ttl_s
        # Found again after a restart = the broker kept its data (bench/chaos.py).
        self._mark = keys.broker_mark(uuid.uuid4().hex)
        self._marked_at = float("-inf")
        # Connection pools whose idle connections a restart leaves stale: redis-py does not
        # retry a pipeline on one, so the first history write after a restart would fail.
        self._pools = tuple(pools)
        self._run_id: str | None = None
        self._down_since: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"toolfleet-broker-watch:{self.broker_url}"
            )

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        await self.client.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:
                raise_if_cancelled()
                log.exception("broker watch %s: unexpected error; continuing", self.broker_url)
            raise_if_cancelled()  # check() reports a failed read as an outage, a cancel too
            await asyncio.sleep(CHECK_INTERVAL_S)

    async def check(self) -> None:
        """One look at the broker: note an outage, or a restart and reconcile after it."""
        try:
            info = await self.client.info("server")
        except (RedisError, OSError) as exc:
            now = self._clock()
            if self._down_since is None:
                self._down_since = now
            outage_log(self.client).failing("broker watch", exc)
            if now - self._down_since > self.outage_limit_s:
                self._fail_all(
                    f"the broker {self.broker_url} has been unreachable for over "
                    f"{self.outage_limit_s:g}s ({masked_url(str(exc))}); the call was "
                    f"enqueued and may have run, but its result cannot arrive. Restart "
                    f"Redis and re-run the call if the tool is safe to repeat"
                )
            return
        if self.on_answer is not None:
            self.on_answer()
        if self._down_since is not None:
            outage_log(self.client).answering("broker watch")
        self._down_since = None
        run_id = str(info.get("run_id", ""))
        previous, self._run_id = self._run_id, run_id
        restarted = previous is not None and run_id != previous
        try:
            kept_data = restarted and bool(await self.client.exists(self._mark))
            if restarted or self._clock() - self._marked_at > _MARK_REFRESH_S:
                await self.client.set(self._mark, run_id, ex=int(_MARK_REFRESH_S * 2))
                self._marked_at = self._clock()
        except (RedisError, OSError):
            self._run_id = previous  # not handled yet: the next check sees the restart again
            return
        if restarted:
            log.warning(
                "broker %s restarted (run_id %s -> %s); reconciling calls in flight",
                self.broker_url,
                previous,
                run_id,
            )
            for pool in self._pools:
                await pool.disconnect(inuse_connections=False)
            if self.on_restart is not None:
                self.on_restart()
            await self.restore_histories(lost=not kept_data)
            await asyncio.sleep(RESTART_GRACE_S)
            await self.reconcile(kept_data=kept_data)

    async def restore_histories(self, *, lost: bool) -> int:
        """Give each branch with a batch in flight back what the restart lost of its history
        (all of it when ``lost``); the number of branches rewritten. A rewrite the broker
        refuses now stays due and is retried before the branch's next write."""
        rewritten = 0
        for durable in self.histories():
            try:
                if await durable.restore(self.client, self.keys, self.record_ttl_s, lost=lost):
                    rewritten += 1
            except (RedisError, OSError) as exc:
                log.warning(
                    "broker %s restart: history of branch %s not checked (%s)",
                    self.broker_url,
                    durable.branch_id,
                    masked_url(str(exc)),
                )
        if rewritten:
            log.warning(
                "broker %s restarted %s: the history of %d branch(es) in flight written again "
                "from memory",
                self.broker_url,
                "without its data" if lost else "without its last writes",
                rewritten,
            )
        return rewritten

    async def reconcile(self, *, kept_data: bool = False) -> None:
        """Deliver the stored record of each awaited call; fail the calls the restart lost:
        no record, and in no queue, not reserved and not started on the new instance.

        With ``kept_data`` (the broker came back with its data) a call found nowhere is not
        failed: it is being enqueued again (the enqueue retries through the outage) or in
        transit, and the reconciler republishes it once if it stays nowhere (C7 keeps that
        safe, since its record would have survived too)."""
        awaited = self.collector.awaited()
        if not awaited:
            return
        raws = await self.client.mget([self.keys.event(call_id) for call_id, _ in awaited])
        lost: list[tuple[str, int]] = []
        for (call_id, attempt), raw in zip(awaited, raws, strict=True):
            if raw is not None:
                self.collector.deliver(raw)
            if self.collector.is_awaited(call_id, attempt):
                lost.append((call_id, attempt))
        if lost and self.queues:
            # As the chaos tests found, a persistent broker comes back with its queues; the
            # calls still queued, reserved or running go on (the reconciler and the
            # worker-lost rules watch them), only those found nowhere were lost.
            sightings = await locate(self.client, self.keys, [c for c, _ in lost], self.queues)
            lost = [(c, a) for c, a in lost if sightings[c].place == Place.NOWHERE]
            if kept_data and lost:
                log.warning(
                    "broker %s restart: it kept its data; %d call(s) not seen yet are left to "
                    "the reconciler",
                    self.broker_url,
                    len(lost),
                )
                lost = []
        for call_id, attempt in lost:
            self.collector.fail(
                call_id,
                attempt,
                BrokerError(
                    f"the broker {self.broker_url} restarted without its data and lost call "
                    f"{call_id} (its queued message or its result) while it was in flight: "
                    f"the call may have run; re-run it if the tool is safe to repeat, and give "
                    f"Redis persistence (appendonly) to survive restarts"
                ),
            )
        if lost:
            log.warning(
                "broker %s restart: %d call(s) in flight were lost", self.broker_url, len(lost)
            )

    def _fail_all(self, text: str) -> None:
        for call_id, attempt in self.collector.awaited():
            self.collector.fail(call_id, attempt, BrokerError(text))
