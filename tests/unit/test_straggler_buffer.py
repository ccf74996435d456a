"""A straggler's wait for its settling ends however the shared flush ends (pure logic: the
flush's Redis round trip is replaced by one that fails)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import toolfleet.dispatcher.send.cancel as cancel
from toolfleet.schemas.wire import CallMessage


def _message(n: int) -> CallMessage:
    return CallMessage(call_id=f"call-{n}", function="add", arguments={})


def test_a_flush_that_raises_ends_every_straggler_wait_with_its_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def failing(*_: Any, **__: Any) -> dict[str, Any]:
        raise RuntimeError("not a broker error")

    monkeypatch.setattr(cancel, "settle_calls", failing)

    async def scenario() -> list[BaseException | Any]:
        buffer = cancel.StragglerBuffer(fleet=None)  # type: ignore[arg-type]
        waits = [buffer.settle(_message(n), None, TimeoutError("late")) for n in range(3)]
        async with asyncio.timeout(5):  # before, these waited forever
            return await asyncio.gather(*waits, return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert [type(o) for o in outcomes] == [RuntimeError] * 3, outcomes


def test_a_cancelled_flush_cancels_every_straggler_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    started = asyncio.Event()

    async def stuck(*_: Any, **__: Any) -> dict[str, Any]:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    monkeypatch.setattr(cancel, "settle_calls", stuck)

    async def scenario() -> list[BaseException | Any]:
        buffer = cancel.StragglerBuffer(fleet=None)  # type: ignore[arg-type]
        waits = [
            asyncio.ensure_future(buffer.settle(_message(n), None, TimeoutError("late")))
            for n in range(2)
        ]
        await started.wait()
        assert buffer._flusher is not None
        buffer._flusher.cancel()
        async with asyncio.timeout(5):
            return await asyncio.gather(*waits, return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
