"""Agent loop, OpenAI Agents SDK: the SDK's own tool execution against the same agent on the
fleet, measured as the other agent loops are (bench/README.md, "Agent loops").

One ``Runner.run`` of ``TURNS`` model turns, each asking for ``CALLS`` parallel calls of the
blocking ``sleep_sync(0.05)`` (``time.sleep``), then a final answer. The model is the SDK's
``ScriptedModel`` (no network), so only the tools' execution differs. ``inprocess`` is the
SDK's own: a sync function tool runs with ``asyncio.to_thread``, on the loop's default
executor (``min(32, cpus + 4)`` threads). ``toolfleet`` is the same agent after
``toolfleet.adapters.openai_agents.on_fleet``, with one sync worker of concurrency ``CALLS``:
each turn is one ``Branch.act``. Each line carries the run's wall time and the agent's
event-loop worst stall: the longest gap between the ticks of a task that sleeps 10 ms in a
loop, as the run goes (``max_tick_gap_ms``; 10 ms is a loop that never stalled). One warm-up
turn runs before the timed run, in both modes.

``python -m bench --only agent-openai-agents``; skipped when ``openai-agents`` is not
installed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
import uuid
from typing import Any

from bench import fleet as fleet_mode
from bench import tools
from bench.measure import Result, percentile

__all__ = ["CALLS", "TURNS", "WORKLOAD", "run"]

WORKLOAD = "agent-openai-agents"
TURNS = 20
CALLS = 8
SLEEP_S = 0.05
TICK_S = 0.01
RUN_TIMEOUT_S = 300.0


def run(ctx: Any) -> list[Result]:
    """The workload: its in-process line and its toolfleet line (with their ratios)."""
    shape = {"turns": TURNS, "calls_per_turn": CALLS, "sleep_s": SLEEP_S}
    calls = TURNS * CALLS
    if importlib.util.find_spec("agents") is None:
        reason = "openai-agents is not installed; pip install '.[openai-agents]'"
        return [
            Result(WORKLOAD, mode, 0, 0.0, skipped=reason) for mode in ("inprocess", "toolfleet")
        ]
    results: list[Result] = []
    if ctx.wants("inprocess"):
        results.append(_line("inprocess", calls, shape, None))
    if ctx.wants("toolfleet"):
        from toolfleet.schemas.settings import Settings

        settings = Settings(broker_url=ctx.broker_url, tools=(fleet_mode.TOOL_MODULE,))
        with fleet_mode.worker(ctx.broker_url, "sync", CALLS, f"bench-{WORKLOAD}"):
            results.append(_line("toolfleet", calls, shape, settings))
    measured = {r.mode: r for r in results if r.ok}
    base, ours = measured.get("inprocess"), measured.get("toolfleet")
    if base is not None and ours is not None:
        ours.ratios["wall_vs_inprocess"] = ours.wall_s / base.wall_s
        ours.ratios["max_tick_gap_vs_inprocess"] = (
            ours.extra["max_tick_gap_ms"] / base.extra["max_tick_gap_ms"]
        )
    return results


def _line(mode: str, calls: int, shape: dict[str, Any], settings: Any) -> Result:
    executor = (
        "SDK's to_thread in the agent's process" if settings is None else f"sync worker x{CALLS}"
    )
    extra = {**shape, "executor": executor}
    try:
        wall_s, gaps, batches = asyncio.run(_measure(settings))
    except Exception as exc:
        return Result(WORKLOAD, mode, calls, 0.0, extra=extra, error=f"{type(exc).__name__}: {exc}")
    extra["max_tick_gap_ms"] = 1000 * max(gaps)
    extra["p99_tick_gap_ms"] = 1000 * percentile(gaps, 99)
    if batches:
        extra["batches"] = len(batches)
        extra["calls_per_batch"] = sorted(set(batches))
    return Result(WORKLOAD, mode, calls, wall_s, extra=extra)


async def _measure(settings: Any) -> tuple[float, list[float], list[int]]:
    """(wall seconds, tick gaps, batch sizes) of one timed run after one warm-up turn."""
    fleet = None
    if settings is not None:
        from toolfleet.dispatcher.fleet import Fleet

        fleet = Fleet(settings)
    try:
        await _agent_run(1, fleet)  # imports, threads, connections: not timed
        stop, gaps = asyncio.Event(), []
        ticker = asyncio.create_task(_ticker(stop, gaps))
        start = time.perf_counter()
        batches = await asyncio.wait_for(_agent_run(TURNS, fleet), RUN_TIMEOUT_S)
        wall_s = time.perf_counter() - start
        stop.set()
        await ticker
        return wall_s, gaps, batches
    finally:
        if fleet is not None:
            await fleet.aclose()


async def _agent_run(turns: int, fleet: Any) -> list[int]:
    """One agent run of ``turns`` turns of ``CALLS`` calls; the batch sizes the fleet got."""
    from agents import Agent, Runner, function_tool
    from agents.items import ToolCallOutputItem
    from agents.run_config import RunConfig
    from agents.testing import ScriptedModel, assistant_message, function_call

    from toolfleet.adapters.openai_agents import binding_of, on_fleet

    tag = uuid.uuid4().hex[:8]
    steps: list[Any] = [
        [
            function_call("sleep_sync", {"seconds": SLEEP_S}, call_id=f"{tag}-t{t}-{i}")
            for i in range(CALLS)
        ]
        for t in range(turns)
    ]
    model = ScriptedModel([*steps, [assistant_message("done")]])
    agent = Agent(name="bench", model=model, tools=[function_tool(tools.sleep_sync)])
    if fleet is not None:
        on_fleet(agent, fleet=fleet)
    config = RunConfig(tracing_disabled=True)
    result = await Runner.run(agent, "go", max_turns=turns + 1, run_config=config)
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    good = sum(1 for output in outputs if output == SLEEP_S)
    if len(outputs) != turns * CALLS or good != turns * CALLS:
        raise RuntimeError(f"{good} of {turns * CALLS} tool calls answered as expected")
    binding = binding_of(agent) if fleet is not None else None
    return list(binding.batch_sizes) if binding is not None else []


async def _ticker(stop: asyncio.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(TICK_S)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
