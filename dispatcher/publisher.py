"""Coalesces the calls that become ready in one loop tick into chunked publishes."""

from __future__ import annotations

import asyncio
import contextlib

from dispatcher.fleet import Fleet
from schemas import tracing
from schemas.tool import Tool
from schemas.wire import CallMessage

__all__ = ["CHUNK_SIZE", "Publisher"]

# Messages per hop to the publishing thread: large enough that a 10,000-call batch costs
# a handful of hops, small enough that the first calls start without waiting for the rest.
CHUNK_SIZE = 500


class Publisher:
    """``await submit(message, tool)`` returns once the message is on the broker."""

    def __init__(
        self, fleet: Fleet, *, chunk_size: int = CHUNK_SIZE, batch_size: int | None = None
    ) -> None:
        self._fleet = fleet
        self._chunk_size = chunk_size
        self._batch_size = batch_size
        self._buffer: list[tuple[CallMessage, Tool, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

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
        while self._buffer:
            chunk = self._buffer[: self._chunk_size]
            del self._buffer[: self._chunk_size]
            live = [(m, t, f) for m, t, f in chunk if not f.done()]
            if not live:
                continue
            try:
                await self._fleet.publish([(m, t) for m, t, _ in live], batch_size=self._batch_size)
            except Exception as exc:
                for _, _, f in live:
                    if not f.done():
                        f.set_exception(exc)
            else:
                for _, _, f in live:
                    if not f.done():
                        f.set_result(None)

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
