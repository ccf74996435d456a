"""How the OpenAI Agents SDK adapter gathers the calls of one model turn into one
``Branch.act`` batch (:class:`Turn`), and answers each call in the model's order.

The SDK starts one task per tool call of a turn; they reach the adapter's invoker in the same
round of the event loop. A turn gathers calls until the loop has gone round
:data:`GATHER_TICKS` times without a new one, then sends them as one act().
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

from toolfleet.dispatcher.branch import Branch
from toolfleet.schemas.action import ActionResponseModel, CallParams

__all__ = ["GATHER_MAX_TICKS", "GATHER_TICKS", "Turn"]

# The calls of one turn are gathered until the event loop has gone round this many times
# without a new one (the SDK's calls of one turn arrive in the same round), and for at most
# GATHER_MAX_TICKS rounds in all.
GATHER_TICKS = 3
GATHER_MAX_TICKS = 100


class FleetBinding(Protocol):
    """What a turn uses of its binding (``openai_agents_binding.FleetBinding``)."""

    @property
    def branch(self) -> Branch: ...

    @property
    def call_params(self) -> CallParams: ...

    @property
    def batch_sizes(self) -> deque[int]: ...

    def turn_ended(self, turn: Turn) -> None: ...


class Turn:
    """The calls of one model turn: gathered, sent as one act(), answered in order."""

    def __init__(
        self, binding: FleetBinding, key: tuple[int, int], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.binding = binding
        self.key = key
        self.envelopes: list[dict[str, Any]] = []
        self.futures: list[asyncio.Future[ActionResponseModel]] = []
        self.waiting = 0
        self.task = loop.create_task(self._gather_and_act())

    async def call(self, envelope: dict[str, Any]) -> ActionResponseModel:
        future: asyncio.Future[ActionResponseModel] = asyncio.get_running_loop().create_future()
        self.envelopes.append(envelope)
        self.futures.append(future)
        self.waiting += 1
        try:
            result = await future
        except asyncio.CancelledError:
            self.waiting -= 1
            if self.waiting == 0 and not self.task.done():
                # Every call of the turn is abandoned (the run was cancelled): cancel the
                # act(), which revokes the queued calls, cancels the running async ones and
                # records them CANCELLED (C9); wait for that before the cancel goes on.
                self.task.cancel()
                await asyncio.wait([self.task])
            raise
        except BaseException:
            self.waiting -= 1
            raise
        self.waiting -= 1
        return result

    async def _gather_and_act(self) -> None:
        try:
            await self._gather()
            sent = [i for i, f in enumerate(self.futures) if not f.done()]
            if sent:
                await self._act(sent)
        except BaseException as exc:
            # Nobody may wait for ever: a call not answered ends with what ended the turn.
            for future in self.futures:
                if future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    async def _gather(self) -> None:
        try:
            seen, quiet = 0, 0
            for _ in range(GATHER_MAX_TICKS):
                if quiet >= GATHER_TICKS:
                    break
                await asyncio.sleep(0)
                if len(self.envelopes) == seen:
                    quiet += 1
                else:
                    seen, quiet = len(self.envelopes), 0
        finally:
            # Later calls of this run start a new turn.
            self.binding.turn_ended(self)

    async def _act(self, sent: list[int]) -> None:
        self.binding.batch_sizes.append(len(sent))
        results = await self.binding.branch.act(
            [self.envelopes[i] for i in sent], call_params=self.binding.call_params
        )
        for i, result in zip(sent, results, strict=True):
            future = self.futures[i]
            if future.done():
                continue  # its SDK task was cancelled on its own (a timeout): result unread
            if isinstance(result, ActionResponseModel):
                future.set_result(result)
            else:
                future.set_exception(RuntimeError(f"no result for the call: {result!r}"))
