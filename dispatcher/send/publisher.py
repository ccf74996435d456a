"""Coalesces the calls that become ready in one loop tick into chunked publishes.

With ``CallParams(bundle_size="auto")`` the same tick decides how to send them
(:func:`auto_plan`): a tool with few calls ready (a lone call, a trickle) gets one message per
call, so its latency is a single message's; a tool with a flood ready gets
``toolfleet.execute_many`` messages, several of them so every worker process gets a share.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from typing import Literal

from toolfleet.broker import tracing
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.send.direct import LeadCommands
from toolfleet.dispatcher.send.publish import publish
from toolfleet.schemas.tool import Tool
from toolfleet.schemas.wire import CallMessage

__all__ = [
    "AUTO_DEEP_IN_FLIGHT",
    "AUTO_MAX_BATCH",
    "AUTO_MIN_CALLS",
    "CHUNK_SIZE",
    "Publisher",
    "auto_plan",
]

# Messages per hop to the publishing thread: large enough that a 10,000-call batch costs
# a handful of hops, small enough that the first calls start without waiting for the rest.
CHUNK_SIZE = 500
# bundle_size="auto": a tool with at least this many calls ready in one tick is a flood and is
# batched; fewer go one per message (the batch would save little and delay nobody).
AUTO_MIN_CALLS = 8
# ... in at least AUTO_SPREAD messages (so several worker processes share a flood) of at most
# AUTO_MAX_BATCH calls (the batched bench's size: past it a message gains little).
AUTO_SPREAD = 4
AUTO_MAX_BATCH = 100
# ... and with this many calls already in flight, even a few ready calls of one tool share one.
AUTO_DEEP_IN_FLIGHT = 32
# How long a deep queue's publisher waits for more ready calls before sending.
AUTO_LINGER_S = 0.01

Calls = Sequence[tuple[CallMessage, Tool]]


def auto_plan(
    calls: Calls, in_flight: int = 0
) -> list[tuple[list[tuple[CallMessage, Tool]], int | None]]:
    """How ``bundle_size="auto"`` sends ``calls``: ``(calls, bundle_size or None)`` per publish.

    Grouped by tool, in first-seen order; a group below AUTO_MIN_CALLS joins the single
    messages, a larger one is batched ``ceil(n / AUTO_SPREAD)`` per message, at most
    AUTO_MAX_BATCH. While ``in_flight`` (calls already sent, not yet answered) is at least
    AUTO_DEEP_IN_FLIGHT the queue is deep: the workers are busy anyway, so a small group of
    one tool goes as one message too (a flood's calls come back, and go out, a few at a time).
    """
    deep = in_flight >= AUTO_DEEP_IN_FLIGHT
    groups: dict[str, list[tuple[CallMessage, Tool]]] = {}
    for message, tool in calls:
        groups.setdefault(tool.function, []).append((message, tool))
    singles: list[tuple[CallMessage, Tool]] = []
    plan: list[tuple[list[tuple[CallMessage, Tool]], int | None]] = []
    for group in groups.values():
        if deep and 1 < len(group) < AUTO_MIN_CALLS:
            plan.append((group, len(group)))
        elif len(group) < AUTO_MIN_CALLS:
            singles.extend(group)
        else:
            size = min(AUTO_MAX_BATCH, math.ceil(len(group) / AUTO_SPREAD))
            plan.append((group, size))
    if singles:
        plan.insert(0, (singles, None))
    return plan


class Publisher:
    """``await submit(message, tool)`` returns once the message is on the broker."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        chunk_size: int = CHUNK_SIZE,
        bundle_size: int | Literal["auto"] | None = None,
    ) -> None:
        self._fleet = fleet
        self._chunk_size = chunk_size
        self._bundle_size = bundle_size
        self._buffer: list[tuple[CallMessage, Tool, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        # Sent ahead of the first message (the batch journal), in the same round trip.
        self.prelude: LeadCommands | None = None

    async def submit(self, message: CallMessage, tool: Tool) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        # Here, in the caller's task, the call's span is current; the flusher task is not it.
        message._trace = tracing.carrier()
        self._buffer.append((message, tool, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        await done

    async def _flush(self) -> None:
        # One yield lets every sibling call that is ready in this tick join the chunk.
        await asyncio.sleep(0)
        if self._bundle_size == "auto" and self._fleet.collector.pending >= AUTO_DEEP_IN_FLIGHT:
            # Deep queue: the workers are busy for a while anyway, so let calls that become
            # ready one reply at a time gather into a message instead of one message each.
            await asyncio.sleep(AUTO_LINGER_S)
        while self._buffer:
            chunk = self._buffer[: self._chunk_size]
            del self._buffer[: self._chunk_size]
            live = [(m, t, f) for m, t, f in chunk if not f.done()]
            if not live:
                continue
            try:
                await self._publish([(m, t) for m, t, _ in live])
            except Exception as exc:
                for _, _, f in live:
                    if not f.done():
                        f.set_exception(exc)
            else:
                for _, _, f in live:
                    if not f.done():
                        f.set_result(None)

    async def _publish(self, calls: Calls) -> None:
        before = self.prelude
        if before is not None and not before.claim():
            await before.wait()  # sent already, or being sent (alone, by a history write)
            before = None
        try:
            if self._bundle_size != "auto":
                await publish(self._fleet, calls, bundle_size=self._bundle_size, before=before)
                return
            for group, size in auto_plan(calls, self._fleet.collector.pending):
                await publish(self._fleet, group, bundle_size=size, before=before)
                before = None
        except BaseException as exc:
            if before is not None:
                before.settle(exc)  # whatever failed, nobody waits for it forever
            raise

    async def aclose(self) -> None:
        flusher, self._flusher = self._flusher, None
        if flusher is not None and not flusher.done():
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        for _, _, f in self._buffer:
            if not f.done():
                f.cancel()
        self._buffer.clear()
