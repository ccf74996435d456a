"""How the OpenAI Agents SDK adapter gathers a turn's calls into one act(), against a stub
branch (no broker): one batch per turn and run, results in order, a batch cancelled only when
every call of it is abandoned, and an act() failure reaching every call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolfleet.adapters.openai_agents import GATHER_TICKS, FleetBinding
from toolfleet.schemas.action import ActionResponseModel


class StubBranch:
    """Answers each call with its own arguments after ``delay_s``; records the batches."""

    def __init__(self, delay_s: float = 0.0, error: Exception | None = None) -> None:
        self.delay_s = delay_s
        self.error = error
        self.batches: list[list[str]] = []
        self.cancelled = 0

    async def act(self, requests: list[dict[str, Any]], **kwargs: Any) -> list[Any]:
        self.batches.append([r["id"] for r in requests])
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.error is not None:
            raise self.error
        return [
            ActionResponseModel(function=r["function"], output=r["arguments"], tool_call_id=r["id"])
            for r in requests
        ]


def _envelope(call_id: str) -> dict[str, Any]:
    return {"function": "echo", "arguments": call_id, "id": call_id}


def _binding(branch: StubBranch) -> FleetBinding:
    return FleetBinding(branch)  # type: ignore[arg-type]


def test_calls_of_one_tick_are_one_batch_per_run_in_order() -> None:
    branch = StubBranch()
    binding = _binding(branch)

    async def scenario() -> list[ActionResponseModel]:
        calls = [binding.submit(1, _envelope(f"a{i}")) for i in range(3)]
        calls.append(binding.submit(2, _envelope("b0")))  # another run: its own batch
        return await asyncio.gather(*calls)

    results = asyncio.run(scenario())
    assert [r.output for r in results] == ["a0", "a1", "a2", "b0"]
    assert sorted(branch.batches) == [["a0", "a1", "a2"], ["b0"]]
    assert sorted(binding.batch_sizes) == [1, 3]


def test_a_call_after_the_gathering_starts_the_next_batch() -> None:
    branch = StubBranch()
    binding = _binding(branch)

    async def late(call_id: str) -> ActionResponseModel:
        for _ in range(GATHER_TICKS + 2):
            await asyncio.sleep(0)
        return await binding.submit(1, _envelope(call_id))

    async def scenario() -> None:
        await asyncio.gather(binding.submit(1, _envelope("first")), late("second"))

    asyncio.run(scenario())
    assert branch.batches == [["first"], ["second"]]


def test_one_abandoned_call_leaves_its_batch_running_all_abandoned_cancel_it() -> None:
    branch = StubBranch(delay_s=0.2)
    binding = _binding(branch)

    async def scenario() -> None:
        a = asyncio.ensure_future(binding.submit(1, _envelope("a")))
        b = asyncio.ensure_future(binding.submit(1, _envelope("b")))
        await asyncio.sleep(0.05)
        a.cancel()  # one call's timeout: the batch goes on, b gets its result
        result = await b
        assert result.output == "b"
        with pytest.raises(asyncio.CancelledError):
            await a
        assert branch.cancelled == 0

        c = asyncio.ensure_future(binding.submit(1, _envelope("c")))
        d = asyncio.ensure_future(binding.submit(1, _envelope("d")))
        await asyncio.sleep(0.05)
        c.cancel()
        d.cancel()  # the run is cancelled: the act() is cancelled, and awaited
        for task in (c, d):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert branch.cancelled == 1

    asyncio.run(scenario())
    assert branch.batches == [["a", "b"], ["c", "d"]]


def test_calls_abandoned_while_gathering_send_nothing() -> None:
    branch = StubBranch()
    binding = _binding(branch)

    async def scenario() -> None:
        task = asyncio.ensure_future(binding.submit(1, _envelope("gone")))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The run's next call is a batch of its own.
        assert (await binding.submit(1, _envelope("next"))).output == "next"

    asyncio.run(scenario())
    assert branch.batches == [["next"]]


def test_an_act_failure_reaches_every_call_of_the_batch() -> None:
    branch = StubBranch(error=RuntimeError("broker gone"))
    binding = _binding(branch)

    async def scenario() -> list[Any]:
        calls = [binding.submit(1, _envelope(f"x{i}")) for i in range(2)]
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert [str(o) for o in outcomes] == ["broker gone", "broker gone"]
