"""The worker's progress reporter (toolfleet.workers.progress), without a worker: Redis down is
logged once per call and never raised into the tool, and the call's end waits for it at most
SETTLE_S; a report's arguments are checked; a tool with nobody listening and no span records
nothing; current_call() is bound around the tool only."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from toolfleet.embedded.processes import free_port
from toolfleet.schemas.progress import (
    MESSAGE_MAX_CHARS,
    ProgressReport,
    check_progress,
    decode,
    encode,
)
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.wire import CallMessage
from toolfleet.workers.current_call import CurrentCall, bind_call, current_call
from toolfleet.workers.progress import SETTLE_S


def _message(*, progress: bool = True) -> CallMessage:
    return CallMessage(
        call_id="c1", function="crunch", reply_to="toolfleet:reply:x", progress=progress
    )


def test_redis_down_is_logged_once_per_call_and_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nothing listens on this port: every push fails at once (connection refused).
    settings = Settings(broker_url=f"redis://127.0.0.1:{free_port()}/0")
    call = CurrentCall(_message(), settings)

    async def tool_run() -> float:
        for i in range(1, 31):
            call.progress(i, total=30)  # returns at once, raises nothing
            await asyncio.sleep(0.02)
        started = time.monotonic()
        await call.settle()
        return time.monotonic() - started

    with caplog.at_level(logging.WARNING, logger="toolfleet.workers.progress"):
        settle_s = asyncio.run(tool_run())
    warnings = [r for r in caplog.records if "did not reach Redis" in r.getMessage()]
    assert len(warnings) == 1 and "c1" in warnings[0].getMessage()
    assert settle_s <= SETTLE_S + 0.5


def test_with_nobody_listening_and_no_span_nothing_is_made() -> None:
    call = CurrentCall(_message(progress=False), Settings())
    call.progress(1, total=2, message="half")
    assert call._reporter is None  # no reporter, no thread, no Redis


def test_progress_arguments_are_checked() -> None:
    assert check_progress(3, 10, "x" * (MESSAGE_MAX_CHARS + 5)) == (
        3.0,
        10.0,
        "x" * MESSAGE_MAX_CHARS,
    )
    for bad in ("3", True, None):
        with pytest.raises(TypeError):
            check_progress(bad)
    with pytest.raises(ValueError):
        check_progress(float("nan"))
    with pytest.raises(TypeError):
        check_progress(1, message=3)


def test_a_report_reads_back_as_itself() -> None:
    report = ProgressReport(call_id="c", function="f", done=1.5, total=None, seq=2, at=1.0)
    assert decode(encode(report)) == report
    assert decode(b'{"progress": garbage}') is None


def test_current_call_is_the_bound_call_inside_and_none_outside() -> None:
    call = CurrentCall(_message(), Settings())
    with bind_call(call):
        assert current_call() is call and current_call().call_id == "c1"
    with pytest.raises(RuntimeError):
        current_call()
