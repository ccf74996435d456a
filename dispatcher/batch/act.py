"""One ``Branch.act()`` batch: its journal, its calls, its results.

The batch puts together three parts, each readable alone: the one-call transaction
(``toolfleet.dispatcher.batch.transaction``: normalize → gate → TOOL_PRE → enqueue → result, with
retries), the window scheduler (``toolfleet.dispatcher.batch.window``: how many calls at once, C8)
and the in-order writer (``toolfleet.dispatcher.batch.writer``: TOOL_POST/TOOL_ERROR → the unit →
observers, in input order, C5). It receives what it needs of its branch: an ``authorize`` callable,
the TOOL_PRE hooks and a history recorder (``toolfleet.dispatcher.history.recorder``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from toolfleet.dispatcher.accept.context import CallContext, new_call_id
from toolfleet.dispatcher.accept.envelope import normalize_batch
from toolfleet.dispatcher.batch.opening import Item, initial_call_id, open_call
from toolfleet.dispatcher.batch.transaction import (
    Authorize,
    Transaction,
    call_message,
    check_wire,
)
from toolfleet.dispatcher.batch.units import DENIED_OUTPUT_ERROR, finished_unit, history_record
from toolfleet.dispatcher.batch.window import Window
from toolfleet.dispatcher.batch.writer import InOrderWriter
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.history.durable import Progress
from toolfleet.dispatcher.history.history import CallReturn, Unit
from toolfleet.dispatcher.history.journal import BatchJournal
from toolfleet.dispatcher.history.recorder import HistoryRecorder
from toolfleet.dispatcher.watch.cancel import cancelled_error, settle_calls, stopped_result
from toolfleet.dispatcher.watch.progress_relay import ProgressCallback, ProgressRelay
from toolfleet.schemas.action import CallParams
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallMessage

__all__ = ["DENIED_OUTPUT_ERROR", "STRATEGIES", "Batch", "Strategy", "check_wire"]

Strategy = Literal["concurrent", "sequential"]
STRATEGIES: tuple[str, ...] = ("concurrent", "sequential")


class Batch:
    """Runs one act() call; construct, then ``await run()``."""

    def __init__(
        self,
        fleet: Fleet,
        requests: Any,
        *,
        recorder: HistoryRecorder,
        authorize: Authorize,
        strategy: str,
        verbose_action: bool,
        suppress_errors: bool,
        call_params: CallParams | None,
        on_progress: Sequence[ProgressCallback] = (),
        session_id: str | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ConfigurationError(
                f"strategy {strategy!r} is not one of {list(STRATEGIES)}; pass 'concurrent' "
                "to run calls in parallel or 'sequential' to run them one after another"
            )
        self.fleet = fleet
        self._recorder = recorder
        self.strategy = strategy
        self.suppress = suppress_errors
        self.params = call_params if call_params is not None else CallParams()
        self.items = normalize_batch(requests, suppress_errors=suppress_errors)
        self.branch_id = branch_id = recorder.branch_id
        # Call ids are fixed up front, so the journal lists every call before the first is
        # enqueued (a dead dispatcher's batch can then be completed), and each call's record
        # names its batch.
        self.batch_id = new_call_id()
        self._call_ids = [initial_call_id(item, branch_id) for item in self.items]
        self._journal = BatchJournal(
            fleet,
            batch_id=self.batch_id,
            branch_id=branch_id,
            strategy=strategy,
            durable=recorder.history.durable,
            signal=recorder.signal,
        )
        # Only when someone listens do the calls' messages ask their workers for progress.
        self._progress = (
            ProgressRelay(on_progress, branch_id=branch_id, signal=recorder.signal)
            if on_progress
            else None
        )
        self._window: Window[Item] = Window(
            self.params.max_in_flight or fleet.settings.max_in_flight,
            self._run_one,
            self._complete,
            self._stops_batch,
        )
        self._transaction = Transaction(
            fleet,
            self.params,
            branch_id=branch_id,
            batch_id=self.batch_id,
            authorize=authorize,
            hooks=recorder.hooks,
            signal=recorder.signal,
            suppress_errors=suppress_errors,
            verbose=verbose_action,
            stopped=lambda: self._window.stopped,
            progress=self._progress,
            session_id=session_id,
        )
        self._writer = InOrderWriter(
            len(self.items),
            self._record,
            self._journal.progress_key,
            closes=(fleet.keys.open_batches(), self.batch_id),
            on_written=self._forget,
        )

    async def run(self) -> list[Any]:
        await self.fleet.learn_tools(getattr(item, "function", None) for item in self.items)
        # Sent with the first publish, or alone before a history write that comes first.
        self._transaction.publisher.prelude = self._journal.start(self.items, self._call_ids)
        try:
            if self.strategy == "sequential":
                units = await self._window.sequential(self.items)
            else:
                units = await self._window.concurrent(self.items)
        except BaseException:
            # C9: cancelled (or a cancellation-class BaseException escaped a hook): every
            # unfinished call is recorded CANCELLED and stopped on the fleet before the
            # exception goes on. Shielded, so a second cancel cannot leave it half-recorded.
            await asyncio.shield(self._finish_cancelled())
            if self._progress is not None:
                await self._progress.aclose(drain=False)
            raise
        finally:
            await self._transaction.publisher.aclose()
        if self._progress is not None:
            await self._progress.aclose()  # every report received is handed over first
        await self._journal.finish(closed_by_write=self._writer.closing_written)
        return self._results(units)

    def _results(self, units: list[CallReturn | None]) -> list[Any]:
        results: list[Any] = []
        first_error: BaseException | None = None
        for unit in units:
            if unit is None:
                results.append(None)
            elif unit.raise_after is not None and self.params.return_exceptions:
                results.append(unit.raise_after)
            else:
                if unit.raise_after is not None and first_error is None:
                    first_error = unit.raise_after
                results.append(unit.result)
        if first_error is not None:
            raise first_error
        if self.params.output_dropna:
            results = [r for r in results if r is not None]
        return results

    async def _record(self, units: Sequence[Unit], progress: Progress) -> None:
        """Write a run of units, never ahead of the batch's journal."""
        opening = self._journal.opening
        if opening is not None:
            await opening.ensure(self.fleet.redis)
        await self._recorder.write(units, self.fleet, progress=progress)

    async def _run_one(self, item: Item, index: int) -> Unit:
        return await self._transaction.run(item, index, self._call_ids[index])

    async def _complete(self, index: int, unit: Unit | None) -> None:
        await self._writer.complete(index, unit)

    def _forget(self, index: int) -> None:
        # Written calls need no context (only unwritten ones are ever cancelled), so a long
        # batch does not keep one per call.
        self._transaction.contexts.pop(index, None)

    def _stops_batch(self, unit: Unit) -> bool:
        return unit.raise_after is not None and not self.params.return_exceptions

    async def _finish_cancelled(self) -> None:
        """C9: write every call not yet written, in input order, then let CancelledError go.

        Finished calls keep their results; every unfinished call is recorded CANCELLED
        (queued ones revoked, running async ones cancelled on their workers).
        """
        await self._writer.close(self._cancelled_units)
        await self._journal.finish(closed_by_write=self._writer.closing_written)

    async def _cancelled_units(self, indexes: list[int]) -> dict[int, Unit | None]:
        transaction = self._transaction
        stopped: list[tuple[int, CallContext, CallMessage]] = []
        units: dict[int, Unit | None] = {}
        for index in indexes:
            ctx = transaction.contexts.get(index)
            if ctx is None:
                units[index] = self._unstarted_unit(index)
                continue
            message = transaction.inflight.get(ctx.call_id) or call_message(
                ctx, batch_id=self.batch_id
            )
            stopped.append((index, ctx, message))
        records = await settle_calls(
            self.fleet,
            [(message, ctx.tool) for _, ctx, message in stopped],
            cancelled_error,
            EventStatus.CANCELLED,
        )
        for index, ctx, message in stopped:
            result = records[message.call_id]
            units[index] = finished_unit(ctx, result, [history_record(ctx, result)])
        return units

    def _unstarted_unit(self, index: int) -> Unit:
        """The unit of a call cancelled before its transaction began (it waited for the window)."""
        opened = open_call(
            self.items[index],
            self.fleet,
            self.branch_id,
            self._call_ids[index],
            raise_after=not self.suppress,
        )
        if isinstance(opened, Unit):
            return opened
        ctx = opened
        message = call_message(ctx, batch_id=self.batch_id)
        result = stopped_result(message, ctx.tool, cancelled_error(message), EventStatus.CANCELLED)
        return finished_unit(ctx, result, [history_record(ctx, result)])
