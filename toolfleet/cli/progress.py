"""What ``toolfleet run`` shows a person: a live progress bar and a closing summary.

The bar counts done / failed / denied, calls per second and the ETA; it is drawn only when the
output is a terminal. Under it, up to :data:`CALL_ROWS` running calls whose tools report
progress (``current_call().progress()``) get a line each: tool, message, done / total. The
summary table gives counts by outcome, the slowest tools and the total time.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from toolfleet.cli.call_record import OUTCOMES, CallRecord
from toolfleet.schemas.progress import CallProgress

__all__ = [
    "CALL_ROWS",
    "PROBLEMS_MAX_ROWS",
    "BatchProgress",
    "render_problems",
    "render_results",
    "render_summary",
    "slowest_tools",
]

_OUTCOME_STYLE = {
    "done": "green",
    "failed": "red",
    "denied": "yellow",
    "cancelled": "magenta",
    "malformed": "red",
}


# Running calls shown with their progress under the bar, at most this many at once.
CALL_ROWS = 5
_CALL_LABEL_CHARS = 40


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        if "call" in task.fields:
            return Text("")
        elapsed = task.elapsed or 0.0
        rate = task.completed / elapsed if elapsed > 0 else 0.0
        return Text(f"{rate:,.1f} calls/s", style="cyan")


class _CountsColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        label = task.fields.get("call")
        if label is not None:  # a running call's line: its tool and latest message
            return Text(label, style="cyan", no_wrap=True, overflow="ellipsis")
        counts: Counter[str] = task.fields.get("counts", Counter())
        text = Text(no_wrap=True)
        for outcome in ("done", "failed", "denied"):
            if text:
                text.append("  ")
            text.append(f"{outcome} {counts.get(outcome, 0)}", style=_OUTCOME_STYLE[outcome])
        for outcome in ("cancelled", "malformed"):
            if counts.get(outcome):
                text.append(f"  {outcome} {counts[outcome]}", style=_OUTCOME_STYLE[outcome])
        return text


class _ConsoleHandler(logging.Handler):
    """Prints WARNING and above through the progress bar's console (above the bar)."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._console.print(Text.assemble(("warning: ", "yellow"), record.getMessage()))
        except Exception:
            self.handleError(record)


class BatchProgress:
    """Counts results as they arrive; draws a live bar on ``console`` when it is a terminal."""

    def __init__(self, total: int, console: Console, *, enabled: bool = True) -> None:
        self.total = total
        self.counts: Counter[str] = Counter()
        self.started_at = time.monotonic()
        self._progress: Progress | None = None
        self._task_id: Any = None
        self._handler: logging.Handler | None = None
        # call_id -> its line's task, for running calls that reported progress.
        self._calls: dict[str, Any] = {}
        if enabled and console.is_terminal:
            # Sized to fit an 80-column terminal on one line.
            self._progress = Progress(
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                _CountsColumn(),
                _RateColumn(),
                TextColumn("{task.fields[eta]}"),
                TimeRemainingColumn(),
                console=console,
                transient=False,
                refresh_per_second=10,
            )
            self._task_id = self._progress.add_task(
                "calls", total=total, counts=self.counts, eta="ETA"
            )

    def __enter__(self) -> BatchProgress:
        if self._progress is not None:
            self._progress.start()
            # A dispatcher warning (no worker for a queue, a lost call) is printed
            # above the live bar instead of tearing it.
            self._handler = _ConsoleHandler(self._progress.console)
            logging.getLogger("toolfleet.dispatcher").addHandler(self._handler)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handler is not None:
            logging.getLogger("toolfleet.dispatcher").removeHandler(self._handler)
            self._handler = None
        if self._progress is not None:
            self._progress.stop()

    def advance_outcome(self, outcome: str) -> None:
        """Count one more finished call (from the session's event observer)."""
        self.counts[outcome] += 1
        if self._progress is not None:
            self._progress.update(self._task_id, advance=1, counts=self.counts)

    @property
    def live(self) -> bool:
        """Whether a bar is drawn (so progress reports are worth asking workers for)."""
        return self._progress is not None

    def show_call(self, progress: CallProgress) -> None:
        """A running call's latest progress report (``Branch.on_progress``)."""
        if self._progress is None:
            return
        label = f"{progress.tool}: {progress.message}" if progress.message else progress.tool
        if len(label) > _CALL_LABEL_CHARS:
            label = label[: _CALL_LABEL_CHARS - 1] + "…"
        task_id = self._calls.get(progress.call_id)
        if task_id is None:
            if len(self._calls) >= CALL_ROWS:
                return
            task_id = self._calls[progress.call_id] = self._progress.add_task(
                "call", total=progress.total, call=label, eta=""
            )
        self._progress.update(task_id, total=progress.total, completed=progress.done, call=label)

    def end_call(self, call_id: str) -> None:
        """A call's result is in: its progress line goes."""
        task_id = self._calls.pop(call_id, None)
        if task_id is not None and self._progress is not None:
            self._progress.remove_task(task_id)

    def finish(self, records: list[CallRecord]) -> None:
        """Replace the live counts with the batch's final results, which are the truth
        (a denied call, for one, never produces an event to observe)."""
        self.counts.clear()
        self.counts.update(record.outcome for record in records)
        if self._progress is not None:
            self._progress.update(self._task_id, completed=len(records), counts=self.counts)
            self._progress.refresh()

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at


def slowest_tools(records: Iterable[CallRecord], limit: int = 5) -> list[tuple[str, float, int]]:
    """(function, slowest duration in seconds, calls) for the tools with the slowest calls."""
    worst: dict[str, float] = {}
    calls: Counter[str] = Counter()
    for record in records:
        if record.function is None or record.duration_s is None:
            continue
        calls[record.function] += 1
        worst[record.function] = max(worst.get(record.function, 0.0), record.duration_s)
    ranked = sorted(worst.items(), key=lambda item: item[1], reverse=True)[:limit]
    return [(name, duration, calls[name]) for name, duration in ranked]


def render_summary(records: list[CallRecord], elapsed_s: float) -> Table:
    """Counts by outcome, the slowest tools and the total time, as one table."""
    counts = Counter(record.outcome for record in records)
    table = Table(title="toolfleet run: summary", show_header=True, header_style="bold")
    table.add_column("outcome")
    table.add_column("calls", justify="right")
    for outcome in OUTCOMES:
        if counts.get(outcome) or outcome in ("done", "failed", "denied"):
            table.add_row(Text(outcome, style=_OUTCOME_STYLE[outcome]), str(counts[outcome]))
    table.add_row("total", str(len(records)), end_section=True)
    rate = len(records) / elapsed_s if elapsed_s > 0 else 0.0
    table.add_row("total time", f"{elapsed_s:.2f}s ({rate:,.1f} calls/s)", end_section=True)
    for name, duration, calls in slowest_tools(records):
        table.add_row(f"slowest: {name}", f"{duration:.3f}s (of {calls} calls)")
    return table


def render_results(records: list[CallRecord], *, width: int = 60) -> Table:
    """One row per result, in input order, for a person reading a small batch."""
    rows = [(r, r.error if r.error is not None else repr(r.output)) for r in records]
    return _calls_table("results", "output / error", rows, width=width)


def _calls_table(
    title: str, last_column: str, rows: list[tuple[CallRecord, str]], *, width: int
) -> Table:
    """A row per call: its line, function and outcome, then ``text`` cut to ``width``."""
    table = Table(title=title, show_header=True, header_style="bold")
    for column in ("line", "function", "outcome", last_column):
        table.add_column(column, overflow="fold")
    for record, text in rows:
        if len(text) > width:
            text = text[: width - 1] + "…"
        table.add_row(
            str(record.line_no),
            record.function or "-",
            Text(record.outcome, style=_OUTCOME_STYLE[record.outcome]),
            text,
        )
    return table


# A batch where most calls fail would otherwise print one row per call; past this many the
# table says how many more there are (every one is in --output / --json).
PROBLEMS_MAX_ROWS = 500


def render_problems(records: list[CallRecord], *, width: int = 80) -> Table | None:
    """The calls that did not complete (failed, denied, malformed, cancelled), in input
    order: what a person needs from a batch too large for the full results table."""
    problems = [record for record in records if record.outcome != "done"]
    if not problems:
        return None
    shown_rows = problems[:PROBLEMS_MAX_ROWS]
    table = _calls_table(
        f"calls that did not complete: {len(problems)}",
        "error",
        [(r, r.error or repr(r.output)) for r in shown_rows],
        width=width,
    )
    if len(problems) > len(shown_rows):
        more = len(problems) - len(shown_rows)
        table.caption = f"… and {more} more; every result is in --output / --json"
    return table
