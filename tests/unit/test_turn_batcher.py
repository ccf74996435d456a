"""The adapters' turn batcher (toolfleet/adapters/_turns.py), with a stand-in branch: the calls
one model turn's tasks submit together are one act(), each task gets its own results, and the
act() is cancelled once every task that waits on it is."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolfleet.adapters._turns import TurnBatcher
from toolfleet.schemas.action import ActionResponseModel, CallParams


class FakeBranch:
    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.release = asyncio.Event()
        self.acting = asyncio.Event()
        self.cancelled = False
        self.cleaned_up = False

    async def act(self, items: list[Any], call_params: CallParams | None = None) -> list[Any]:
        self.batches.append(list(items))
        self.acting.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            await asyncio.sleep(0.01)  # C9's recording, before the cancel goes on
            self.cleaned_up = True
            raise
        return [ActionResponseModel(function=str(i), output=i) for i in items]


def fake() -> Any:
    """A FakeBranch, typed as the Branch the batcher expects."""
    return FakeBranch()


def test_a_turns_calls_are_one_batch_in_order_and_each_task_gets_its_own_results() -> None:
    async def scenario() -> tuple[FakeBranch, list[list[Any]], TurnBatcher]:
        batcher, branch = TurnBatcher(), fake()
        branch.release.set()
        tasks = [
            asyncio.create_task(batcher.submit("run", lambda: branch, items))
            for items in ([1], [2, 3], [4])
        ]
        results = await asyncio.gather(*tasks)
        # A call after the batch was sent starts a batch of its own; another key too.
        await batcher.submit("run", lambda: branch, [5])
        await batcher.submit("other", lambda: branch, [6])
        return branch, [[r.output for r in rs] for rs in results], batcher

    branch, outputs, batcher = asyncio.run(scenario())
    assert branch.batches == [[1, 2, 3, 4], [5], [6]]
    assert outputs == [[1], [2, 3], [4]]
    assert list(batcher.batch_sizes) == [4, 1, 1]


def test_a_lone_cancelled_task_leaves_the_batch_to_its_siblings() -> None:
    async def scenario() -> tuple[FakeBranch, list[Any]]:
        batcher, branch = TurnBatcher(), fake()
        first = asyncio.create_task(batcher.submit("run", lambda: branch, [1]))
        second = asyncio.create_task(batcher.submit("run", lambda: branch, [2]))
        await branch.acting.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        branch.release.set()
        return branch, await second

    branch, [result] = asyncio.run(scenario())
    assert not branch.cancelled and result.output == 2


def test_when_every_task_is_cancelled_the_act_is_and_its_cleanup_ends_first() -> None:
    async def scenario() -> FakeBranch:
        batcher, branch = TurnBatcher(), fake()
        tasks = [asyncio.create_task(batcher.submit("run", lambda: branch, [i])) for i in range(3)]
        await branch.acting.wait()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with pytest.raises(asyncio.CancelledError):
                await task
        assert branch.cleaned_up  # the act() finished recording before the last cancel
        return branch

    branch = asyncio.run(scenario())
    assert branch.cancelled and branch.batches == [[0, 1, 2]]


def test_tasks_cancelled_before_the_batch_is_sent_send_nothing() -> None:
    async def scenario() -> FakeBranch:
        batcher, branch = TurnBatcher(), fake()
        task = asyncio.create_task(batcher.submit("run", lambda: branch, [1]))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)
        return branch

    assert asyncio.run(scenario()).batches == []
