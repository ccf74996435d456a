"""An ``async def`` tool that blocks the asyncio pool's loop is named in the worker's log:
the tool, its call id and how long it held the loop, once per tool per minute."""

from __future__ import annotations

import re

from tests.support.fleet import WorkerProcess, call, run
from tests.support.waiting import until
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

WARNING = re.compile(
    r"async tool 'blocks_loop' \(call ([0-9a-f-]{36})\) blocked the event loop for "
    r"([0-9.]+)s"
)


def test_a_blocking_async_tool_is_named_with_how_long_it_held_the_loop(
    fleet_settings: Settings, async_worker: WorkerProcess, sync_worker: WorkerProcess
) -> None:
    async def scenario(fleet: Fleet) -> list[tuple[str, EventStatus]]:
        branch = Branch(fleet=fleet)
        results = await branch.act(
            [call("sleep_async", seconds=0.3), call("blocks_loop", seconds=1.0)]
        )
        return [(r.call_id or "", r.status) for r in results]

    [(_, well_behaved), (blocker_id, blocked)] = run(fleet_settings, scenario)
    assert well_behaved == blocked == EventStatus.COMPLETED
    match = until(
        lambda: WARNING.search(async_worker.log()),
        timeout_s=15,
        what="the pool's warning naming blocks_loop",
    )
    assert match.group(1) == blocker_id
    assert 0.8 <= float(match.group(2)) <= 5.0
    assert "'sleep_async'" not in async_worker.log()  # a well-behaved tool is never named

    # A second block within the minute is counted, not logged again; the 0.3 s call after it
    # (sequential) gives the watcher three beats to have reported it, were it to.
    run(
        fleet_settings,
        lambda fleet: Branch(fleet=fleet).act(
            [call("blocks_loop", seconds=1.0), call("sleep_async", seconds=0.3)],
            strategy="sequential",
        ),
    )
    assert len(WARNING.findall(async_worker.log())) == 1
