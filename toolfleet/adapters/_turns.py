"""What the LangGraph and Pydantic AI adapters share: which toolfleet branch acts for a
conversation, and how the tool calls of one model turn become one ``Branch.act`` batch.

A framework runs a turn's parallel tool calls as separate tasks (Pydantic AI: one task per
call; LangGraph's ``Send``: one node run per call), each awaiting its own result.
:class:`TurnBatcher` gathers the calls that arrive together — in the same few event-loop
ticks — into one batch, gives each waiter its own results, and cancels the batch (C9) once
every waiter is gone.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from toolfleet.dispatcher.branch import Branch, ProgressCallback
from toolfleet.dispatcher.fleet import Fleet, default_fleet
from toolfleet.dispatcher.govern.callbacks import call_user
from toolfleet.dispatcher.govern.hooks import HookBus, HookPoint
from toolfleet.dispatcher.session import Session
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.tool import Tool
from toolfleet.workers.registry import Registry

__all__ = ["Conversations", "TurnBatcher", "fleet_tool", "run_blocking"]

T = TypeVar("T")

# A turn's calls start in the same loop iteration (their tasks are created together); a batch
# is sent once this many ticks pass with no new call, and at the latest after _MAX_TICKS.
_SETTLE_TICKS = 2
_MAX_TICKS = 200


class Conversations:
    """The toolfleet :class:`Branch` each conversation of a framework acts on.

    ``branch`` given: every call goes to it (its hooks, its session). Otherwise a conversation
    with an id (a LangGraph ``thread_id``, a Pydantic AI ``conversation_id``) acts on the
    branch ``"<prefix>:<id>"``: its history is in Redis under that id, and its call ids are
    derived from the model's tool-call ids within it, so a replayed turn is answered from the
    workers' records without running again (C7). A call without a conversation id gets a fresh
    branch. These branches are ``session``'s (its gates and observers) and run the handlers of
    :attr:`hooks` (TOOL_PRE guards, TOOL_POST, TOOL_ERROR) as their own.
    """

    def __init__(
        self,
        prefix: str,
        *,
        fleet: Fleet | None = None,
        branch: Branch | None = None,
        session: Session | None = None,
    ) -> None:
        if branch is not None and session is not None:
            raise ConfigurationError(
                "pass branch= or session=, not both: a branch acts under its own session"
            )
        self.prefix = prefix
        self.branch = branch
        self.session = session
        self._fleet = fleet
        self.hooks = branch.hooks if branch is not None else HookBus()

    @property
    def fleet(self) -> Fleet:
        """``fleet``, else the branch's or the session's, else ``Fleet.from_env()``."""
        if self._fleet is not None:
            return self._fleet
        if self.branch is not None:
            return self.branch.fleet
        if self.session is not None and self.session.fleet is not None:
            return self.session.fleet
        return default_fleet()

    def branch_id(self, conversation: str | None) -> str | None:
        """The id of the branch a conversation acts on (None: a fresh one per call)."""
        if self.branch is not None:
            return self.branch.id
        return f"{self.prefix}:{conversation}" if conversation else None

    def branch_for(self, conversation: str | None) -> Branch:
        if self.branch is not None:
            return self.branch
        branch = Branch(self.session, fleet=self.fleet, id=self.branch_id(conversation))
        if conversation is None and self.session is not None:
            # Nobody can name a one-off branch again: the session need not keep it.
            self.session.branches.pop(branch.id, None)
        for point in HookPoint:
            branch.hooks.on(point, self._forward(point))
        return branch

    def _forward(self, point: HookPoint) -> Callable[[dict[str, Any]], Coroutine[Any, Any, None]]:
        # Each handler runs as if registered on the branch itself: a TOOL_PRE exception
        # aborts the call (C3), StopHook ends the chain.
        async def forward(payload: dict[str, Any]) -> None:
            for handler in self.hooks.handlers(point):
                await call_user(handler, payload)

        forward.__qualname__ = f"{self.prefix}.hooks[{point.value}]"
        return forward


@dataclass
class _Waiter:
    start: int
    count: int
    future: asyncio.Future[list[ActionResponseModel]]
    order: int | None = None
    gone: bool = False


@dataclass
class _Turn:
    branch: Branch
    call_params: CallParams | None
    on_progress: ProgressCallback | None = None
    items: list[Any] = field(default_factory=list)
    waiters: list[_Waiter] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class TurnBatcher:
    """One ``Branch.act`` per model turn, from calls awaited by separate tasks.

    Calls submitted under the same key (a run, a conversation) in the same few loop ticks
    form one batch, in the order they were submitted. Each submitter gets its own results.
    A submitter that is cancelled stops waiting; when all of a batch's submitters are gone,
    the batch is cancelled, so its calls are revoked or cancelled on the workers and recorded
    CANCELLED (C9) before the last cancellation goes on.
    """

    def __init__(self) -> None:
        self._open: dict[Hashable, _Turn] = {}
        # What the latest batches held, oldest first (for tests and the bench).
        self.batch_sizes: deque[int] = deque(maxlen=1000)

    async def submit(
        self,
        key: Hashable,
        branch: Callable[[], Branch],
        items: Sequence[Any],
        call_params: CallParams | None = None,
        on_progress: ProgressCallback | None = None,
        *,
        order: int | None = None,
    ) -> list[ActionResponseModel]:
        """``items``' results, run in the batch of ``key``'s turn; ``on_progress`` hears the
        batch's progress reports (the first submitter's callback is the turn's). ``order``:
        the items' place in the model's turn, when the submitters may arrive out of it."""
        loop = asyncio.get_running_loop()
        key = (loop, key)  # a turn is gathered on one event loop
        turn = self._open.get(key)
        if turn is None:
            turn = _Turn(branch(), call_params, on_progress)
            self._open[key] = turn
            turn.task = loop.create_task(self._run(key, turn))
        waiter = _Waiter(len(turn.items), len(items), loop.create_future(), order)
        turn.items.extend(items)
        turn.waiters.append(waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            waiter.gone = True
            task = turn.task
            if task is not None and not task.done() and all(w.gone for w in turn.waiters):
                task.cancel()
                # The batch records its unfinished calls CANCELLED before this goes on.
                await asyncio.wait([task])
            raise

    async def _run(self, key: Hashable, turn: _Turn) -> None:
        seen, quiet, ticks = -1, 0, 0
        while quiet < _SETTLE_TICKS and ticks < _MAX_TICKS:
            await asyncio.sleep(0)
            ticks += 1
            quiet = quiet + 1 if len(turn.items) == seen else 0
            seen = len(turn.items)
        if self._open.get(key) is turn:
            del self._open[key]  # later calls start a batch of their own
        if all(w.gone for w in turn.waiters):
            return
        self.batch_sizes.append(len(turn.items))
        _in_turn_order(turn)
        try:
            if turn.on_progress is None:
                results = await turn.branch.act(turn.items, call_params=turn.call_params)
            else:  # asks the workers for progress reports (free when nobody listens)
                results = await turn.branch.act(
                    turn.items, call_params=turn.call_params, on_progress=turn.on_progress
                )
        except asyncio.CancelledError:
            for w in turn.waiters:
                w.future.cancel()
            raise
        except BaseException as exc:
            for w in turn.waiters:
                if not w.future.done():
                    w.future.set_exception(exc)
            return
        for w in turn.waiters:
            if not w.future.done():
                w.future.set_result(results[w.start : w.start + w.count])


def _in_turn_order(turn: _Turn) -> None:
    """Put the turn's items in the order their submitters gave (arrival order otherwise)."""
    if all(w.order is None for w in turn.waiters):
        return
    # The waiters too: their results are handed out in this order, so the submitters resume
    # (and the first failure among them raises) in the turn's order, as a local run does.
    turn.waiters.sort(key=lambda w: (w.order is None, w.order or 0))
    items: list[Any] = []
    for w in turn.waiters:
        chunk = turn.items[w.start : w.start + w.count]
        w.start = len(items)
        items.extend(chunk)
    turn.items = items


def fleet_tool(registry: Registry, item: Any) -> Tool:
    """The registered toolfleet tool ``item`` names: a tool name, a toolfleet ``Tool``, or a
    function decorated with ``@tool``. ConfigurationError when the fleet has no such tool."""
    if isinstance(item, Tool):
        item = item.function
    if isinstance(item, str):
        if item in registry:
            return registry.get(item)
    elif callable(item):
        for known in registry:
            if known.func_callable is item:
                return known
    raise ConfigurationError(
        f"{item!r} is not a tool of this fleet (its registry has {registry.names()}); "
        "decorate it with toolfleet's @tool in a module named in TOOLFLEET_TOOLS, or pass a "
        "registered tool's name"
    )


_blocking_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def run_blocking(act: Callable[[], T]) -> T:
    """``act()`` (an ``act_sync``) here, or, when this thread runs an event loop (a notebook
    cell calling a framework's sync API), on a helper thread while this one waits."""
    global _blocking_pool
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return act()
    with _pool_lock:
        if _blocking_pool is None:
            _blocking_pool = ThreadPoolExecutor(4, thread_name_prefix="toolfleet-adapter")
    return _blocking_pool.submit(act).result()
