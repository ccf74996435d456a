"""Where progress shows (docs/controls.md): MCP ``notifications/progress`` for a request with a
progress token (the mcp package's own client, ``toolfleet mcp`` over stdio), the ``toolfleet
run`` screen's line per running call, and the ``toolfleet.progress`` event on the tool's span
on the worker (tests/support/otlp_collector.py). Real workers.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from rich.console import Console

from tests.support.fleet import REPO_ROOT, WorkerProcess, call, run, start_worker
from tests.support.otlp_collector import OtlpCollector, ReceivedSpan
from tests.support.waiting import until
from toolfleet.cli.batch_file import BatchLine
from toolfleet.cli.batch_runner import run_batch
from toolfleet.cli.progress import BatchProgress
from toolfleet.dispatcher import Branch, CallProgress, Fleet
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus


def test_an_mcp_client_with_a_progress_token_gets_progress_notifications(
    fleet_settings: Settings, async_worker: WorkerProcess, sync_worker: WorkerProcess
) -> None:
    """``toolfleet mcp`` over stdio, on the session's workers, with the mcp package's client."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["TOOLFLEET_BROKER_URL"] = fleet_settings.broker_url or ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    script = Path(sys.executable).parent / "toolfleet"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "toolfleet.cli"]
    params = StdioServerParameters(
        command=command[0],
        args=[*command[1:], "mcp", "--tools", "tests.support.sample_tools"],
        env=env,
        cwd=str(REPO_ROOT),
    )
    notified: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notified.append((progress, total, message))

    async def main() -> tuple[types.CallToolResult, types.CallToolResult]:
        with anyio.fail_after(60):
            async with Client(params) as client:
                result = await client.call_tool(
                    "count_async", {"n": 3, "delay_s": 0.15}, progress_callback=on_progress
                )
                # No progress token: no notifications (and the worker is asked for none).
                quiet = await client.call_tool("count_sync", {"n": 2, "delay_s": 0.15})
                return result, quiet

    result, quiet = anyio.run(main)
    assert not result.is_error and not quiet.is_error
    assert notified == [(float(i), 3.0, f"step {i} of 3") for i in (1, 2, 3)]


def test_the_run_screen_shows_a_line_per_running_call(
    fleet_settings: Settings, sync_worker: WorkerProcess
) -> None:
    screen = io.StringIO()
    progress = BatchProgress(2, Console(file=screen, force_terminal=True, width=100))
    assert progress.live
    shown: list[CallProgress] = []
    ended: list[str] = []

    def show(report: CallProgress) -> None:
        shown.append(report)
        progress.show_call(report)

    def end(call_id: str) -> None:
        ended.append(call_id)
        progress.end_call(call_id)

    lines = [
        BatchLine(line_no=1, function="count_sync", arguments={"n": 3, "delay_s": 0.25}),
        BatchLine(line_no=2, function="add", arguments={"a": 1, "b": 2}),
    ]
    with progress:
        result = asyncio.run(
            run_batch(
                lines,
                settings=fleet_settings,
                on_progress=progress.advance_outcome,
                on_call_progress=show,
                on_call_end=end,
            )
        )
        progress.finish(result.records)
    assert [r.outcome for r in result.records] == ["done", "done"]
    assert [p.done for p in shown] == [1.0, 2.0, 3.0]
    assert shown[0].call_id in ended and progress._calls == {}
    assert "count_sync: step 2 of 3" in screen.getvalue()


@pytest.fixture(scope="module")
def traced_async(
    fleet_settings: Settings, redis_url: str
) -> Iterator[tuple[Settings, OtlpCollector]]:
    """An async worker on a queue of its own, exporting its spans to a collector."""
    with OtlpCollector() as collector:
        queue = f"toolfleet.async.progress-{uuid.uuid4().hex[:8]}"
        env = {
            "TOOLFLEET_ASYNC_QUEUE": queue,
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_TRACES_SAMPLER": "always_on",
        }
        worker = start_worker("async", redis_url=redis_url, concurrency=10, env=env)
        try:
            yield fleet_settings.model_copy(update={"async_queue": queue}), collector
        finally:
            worker.stop()


def test_each_report_sent_is_an_event_on_the_tools_span(
    traced_async: tuple[Settings, OtlpCollector],
) -> None:
    settings, collector = traced_async

    async def scenario(fleet: Fleet) -> Any:
        (result,) = await Branch(fleet=fleet).act([call("count_async", n=3, delay_s=0.15)])
        return result

    # Nobody listens on the dispatcher: the span still gets every report.
    result = run(settings, scenario)
    assert result.status is EventStatus.COMPLETED

    def tool_span(spans: list[ReceivedSpan]) -> bool:
        return any(_is_tool_span(s, result.call_id, spans) for s in spans)

    spans = until(lambda: collector.spans_where(tool_span), timeout_s=20, what=collector.names)
    (span,) = [s for s in spans if _is_tool_span(s, result.call_id, spans)]
    events = [attributes for name, attributes in span.events if name == "toolfleet.progress"]
    assert [(e["done"], e["total"], e["message"]) for e in events] == [
        (1.0, 3.0, "step 1 of 3"),
        (2.0, 3.0, "step 2 of 3"),
        (3.0, 3.0, "step 3 of 3"),
    ]


def _is_tool_span(span: ReceivedSpan, call_id: str, spans: list[ReceivedSpan]) -> bool:
    """``toolfleet.tool count_async`` under the worker span of ``call_id``."""
    if span.name != "toolfleet.tool count_async":
        return False
    parents = [s for s in spans if s.span_id == span.parent_span_id]
    return any(p.attributes.get("toolfleet.call_id") == call_id for p in parents)
