"""The window scheduler of one act() batch: which calls run, and how many at once (C8).

``sequential`` runs one call after another; ``concurrent`` keeps at most ``size`` calls in
flight (CallParams.max_in_flight, else settings.max_in_flight). A call whose unit should
stop the batch (an exception act() raises after writing) stops it: no later call starts.
Each finished call is handed to ``complete`` (the in-order writer) as soon as it finishes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar, cast

from toolfleet.dispatcher.history.history import CallReturn, Unit

__all__ = ["Window"]

T = TypeVar("T")

RunOne = Callable[[T, int], Awaitable[Unit]]
Complete = Callable[[int, Unit | None], Awaitable[None]]


class Window(Generic[T]):
    """Schedules ``run(item, index)`` over a batch's items; ``stopped`` once a unit says so."""

    def __init__(
        self,
        size: int,
        run: RunOne[T],
        complete: Complete,
        stops: Callable[[Unit], bool],
    ) -> None:
        self._slots = asyncio.Semaphore(size)
        self._run = run
        self._complete = complete
        self._stops = stops
        self.stopped = False

    async def sequential(self, items: Sequence[T]) -> list[CallReturn | None]:
        # Only each call's result is kept here, to bound memory; its history goes to the writer.
        units: list[CallReturn | None] = [None] * len(items)
        for index, item in enumerate(items):
            unit = await self._run(item, index)
            units[index] = unit.kept()
            await self._complete(index, unit)
            if self._stops(unit):
                break
        return units

    async def concurrent(self, items: Sequence[T]) -> list[CallReturn | None]:
        # A task exists only for a call inside the window (C8), so a 100,000-call batch holds
        # `size` tasks at a time, not one per call waiting on the semaphore.
        units: list[CallReturn | None] = [None] * len(items)
        running: set[asyncio.Task[None]] = set()
        failed: list[asyncio.Task[None]] = []

        def done(task: asyncio.Task[None]) -> None:
            running.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failed.append(task)

        try:
            for index, item in enumerate(items):
                await self._slots.acquire()
                if failed:
                    self._slots.release()
                    break
                task = asyncio.ensure_future(self._windowed(index, item, units))
                running.add(task)
                task.add_done_callback(done)
            while running:
                await asyncio.wait(set(running), return_when=asyncio.FIRST_EXCEPTION)
                if failed:
                    break
            if failed:
                raise cast(BaseException, failed[0].exception())
        except BaseException:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise
        return units

    async def _windowed(self, index: int, item: T, units: list[CallReturn | None]) -> None:
        try:
            unit = None if self.stopped else await self._run(item, index)
        finally:
            self._slots.release()
        units[index] = None if unit is None else unit.kept()
        if unit is not None and self._stops(unit):
            self.stopped = True
        await self._complete(index, unit)
