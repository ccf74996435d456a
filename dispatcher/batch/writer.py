"""The in-order writer of one act() batch (C5, C9).

Calls finish in any order; their units are written in input order. A finished unit waits
until every earlier call is written, then the whole ready run is written at once. Each write
is shielded, so a cancelled caller never cuts a unit in half, and it advances the batch
journal's written count in the same Redis script (``toolfleet.dispatcher.history.journal``), so
``toolfleet recover`` knows exactly which units are missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from toolfleet.dispatcher.history.durable import Progress
from toolfleet.dispatcher.history.history import Unit

__all__ = ["InOrderWriter", "Record"]

# Writes units in order and advances the written count (HistoryRecorder.write, bound).
Record = Callable[[Sequence[Unit], Progress], Awaitable[None]]


class InOrderWriter:
    """Holds finished units by input index and writes each run once it is next in order."""

    def __init__(
        self,
        total: int,
        record: Record,
        progress_key: str,
        *,
        closes: tuple[str, str] | None = None,
        on_written: Callable[[int], None] = lambda index: None,
    ) -> None:
        self._total = total
        self._record = record
        self._progress_key = progress_key
        # (open-batches hash, batch id): the write that completes the batch closes its journal.
        self._closes = closes
        # Whether that write was made (written, or kept in the history's backlog to retry).
        self.closing_written = False
        # Told each index as it is written (the batch forgets that call's context).
        self._on_written = on_written
        self._ready: dict[int, Unit | None] = {}
        self._next = 0
        self._lock = asyncio.Lock()
        self._writing: asyncio.Future[None] | None = None

    async def complete(self, index: int, unit: Unit | None) -> None:
        """Hold ``unit`` until every earlier call is written, then write the ready run."""
        self._ready[index] = unit
        async with self._lock:
            await self._landed()
            run: list[Unit] = []
            before = self._next
            while self._next in self._ready:
                ready = self._ready.pop(self._next)
                self._on_written(self._next)
                self._next += 1
                if ready is not None:
                    run.append(ready)
            if run:
                await self._write(run, before, self._next)

    async def close(self, fill: Callable[[list[int]], Awaitable[dict[int, Unit | None]]]) -> None:
        """Write every call not yet written, in input order, and end the batch (C9).

        Units already finished are kept; ``fill(indexes)`` gives the units of the others
        (recorded CANCELLED by the batch). Not shielded here: the caller shields it.
        """
        async with self._lock:
            await self._landed()
            units: dict[int, Unit | None] = {}
            missing: list[int] = []
            for index in range(self._next, self._total):
                if index in self._ready:
                    units[index] = self._ready.pop(index)
                else:
                    missing.append(index)
            units.update(await fill(missing))
            before, self._next = self._next, self._total
            ordered = [u for _, u in sorted(units.items()) if u is not None]
            if ordered:
                await self._record(ordered, self._progress(before, self._next))

    async def _write(self, run: list[Unit], before: int, after: int) -> None:
        """Write ``run`` shielded: a cancelled caller cannot cut a unit in half (C5)."""
        self._writing = asyncio.ensure_future(self._record(run, self._progress(before, after)))
        await asyncio.shield(self._writing)
        self._writing = None

    def _progress(self, before: int, after: int) -> Progress:
        if after < self._total or self._closes is None:
            return Progress(self._progress_key, before, after)
        self.closing_written = True
        return Progress(self._progress_key, before, after, self._closes)

    async def _landed(self) -> None:
        """Wait for a write whose task was cancelled mid-way, so units land in input order."""
        if self._writing is not None:
            await asyncio.shield(self._writing)
            self._writing = None
