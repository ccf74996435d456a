"""Agent loops: a framework's own tool execution against the same loop on the fleet.

One agent run of ``TURNS`` model turns, each asking for ``CALLS`` parallel calls of the
blocking ``sleep_sync(0.05)`` (``time.sleep``), then a final answer; the model is scripted, so
only the tools' execution differs. ``inprocess`` is the framework's own ``ToolNode`` /
function toolset (both run a sync tool on a thread of the agent's process); ``toolfleet`` the
adapter (``FleetToolNode`` / ``FleetToolset``) with one sync worker of concurrency ``CALLS``.
Each line carries the run's wall time and the agent's event-loop worst stall: the longest gap
between the ticks of a task that sleeps 10 ms in a loop, as the run goes (``max_tick_gap_ms``;
10 ms is a loop that never stalled). One warm-up turn runs before the timed run, in both modes.

``python -m bench --only agent-langgraph --only agent-pydantic-ai``. A framework is one entry of
:data:`FRAMEWORKS`: how to run the loop in process, and on a fleet. ``bench/agent_openai_agents.py``
measures its own framework with :func:`workload` and :func:`check` from here.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench import fleet as fleet_mode
from bench import tools
from bench.measure import Result, percentile

__all__ = ["CALLS", "FRAMEWORKS", "SLEEP_S", "TURNS", "Framework", "check", "workload"]

TURNS = 20
CALLS = 8
SLEEP_S = 0.05
TICK_S = 0.01
RUN_TIMEOUT_S = 300.0

# (turns, calls per turn, fleet or None) -> the batch sizes the fleet was sent (empty in process)
Loop = Callable[[int, int, Any], Awaitable[list[int]]]


@dataclass(frozen=True)
class Framework:
    package: str  # what must be importable, else the lines are skipped
    run: Loop
    missing: str  # the skipped lines' reason when ``package`` is not importable
    executor: str = "threads of the agent's process"  # who runs the tools in process


async def _langgraph(turns: int, calls: int, fleet: Any) -> list[int]:
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import StructuredTool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from toolfleet.adapters.langgraph import FleetToolNode

    node: ToolNode
    if fleet is None:
        node = ToolNode([StructuredTool.from_function(tools.sleep_sync)])
    else:
        node = FleetToolNode(["sleep_sync"], fleet=fleet)
    said = 0

    async def agent(state: MessagesState) -> dict[str, Any]:
        nonlocal said
        said += 1
        if said > turns:
            return {"messages": [AIMessage("done")]}
        batch = [
            {"name": "sleep_sync", "args": {"seconds": SLEEP_S}, "id": f"t{said}-{i}"}
            for i in range(calls)
        ]
        return {"messages": [AIMessage("", tool_calls=batch)]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 4 * turns + 10}
    out = await builder.compile().ainvoke({"messages": [HumanMessage("go")]}, config)
    answers = [m for m in out["messages"] if getattr(m, "type", "") == "tool"]
    check(answers, turns * calls, lambda m: m.status == "success" and m.content == str(SLEEP_S))
    return list(node.batcher.batch_sizes) if isinstance(node, FleetToolNode) else []


async def _pydantic_ai(turns: int, calls: int, fleet: Any) -> list[int]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

    from toolfleet.adapters.pydantic_ai import FleetToolset

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        said = sum(isinstance(m, ModelResponse) for m in messages)
        if said >= turns:
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(
            parts=[
                ToolCallPart("sleep_sync", {"seconds": SLEEP_S}, tool_call_id=f"t{said}-{i}")
                for i in range(calls)
            ]
        )

    toolset: AbstractToolset[Any]
    if fleet is None:
        toolset = FunctionToolset([tools.sleep_sync])
    else:
        toolset = FleetToolset(["sleep_sync"], fleet=fleet)
    result = await Agent(FunctionModel(model), toolsets=[toolset]).run("go")
    answers = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    check(answers, turns * calls, lambda p: p.outcome == "success" and p.content == SLEEP_S)
    return list(toolset.batcher.batch_sizes) if isinstance(toolset, FleetToolset) else []


FRAMEWORKS: dict[str, Framework] = {
    "langgraph": Framework(
        "langgraph", _langgraph, "langgraph is not installed; pip install '.[langgraph]'"
    ),
    "pydantic-ai": Framework(
        "pydantic_ai", _pydantic_ai, "pydantic_ai is not installed; pip install '.[pydantic-ai]'"
    ),
}


def check(answers: list[Any], expected: int, ok: Callable[[Any], bool]) -> None:
    """Raise unless there are ``expected`` answers and ``ok`` holds for each."""
    good = sum(1 for a in answers if ok(a))
    if len(answers) != expected or good != expected:
        raise RuntimeError(f"{good} of {expected} tool calls answered as expected")


async def _ticker(stop: asyncio.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(TICK_S)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


def _measure(framework: Framework, settings: Any) -> tuple[float, list[float], list[int]]:
    """(wall seconds, tick gaps, batch sizes) of one timed run after one warm-up turn."""

    async def main() -> tuple[float, list[float], list[int]]:
        fleet = None
        if settings is not None:
            from toolfleet.dispatcher.fleet import Fleet

            fleet = Fleet(settings)
        try:
            await framework.run(1, CALLS, fleet)  # imports, threads, connections: not timed
            stop, gaps = asyncio.Event(), []
            ticker = asyncio.create_task(_ticker(stop, gaps))
            start = time.perf_counter()
            batches = await asyncio.wait_for(framework.run(TURNS, CALLS, fleet), RUN_TIMEOUT_S)
            wall_s = time.perf_counter() - start
            stop.set()
            await ticker
            return wall_s, gaps, batches
        finally:
            if fleet is not None:
                await fleet.aclose()

    return asyncio.run(main())


def workload(name: str, framework: Framework | None = None) -> Callable[[Any], list[Result]]:
    """The bench workload ``agent-<name>``: its in-process line and its toolfleet line.

    ``framework`` is ``FRAMEWORKS[name]`` unless given."""
    if framework is None:
        framework = FRAMEWORKS[name]
    label = f"agent-{name}"

    def run(ctx: Any) -> list[Result]:
        shape = {"turns": TURNS, "calls_per_turn": CALLS, "sleep_s": SLEEP_S}
        calls = TURNS * CALLS
        if importlib.util.find_spec(framework.package) is None:
            return [
                Result(label, mode, 0, 0.0, skipped=framework.missing)
                for mode in ("inprocess", "toolfleet")
            ]
        results: list[Result] = []
        if ctx.wants("inprocess"):
            results.append(_line(label, "inprocess", calls, shape, framework, None))
        if ctx.wants("toolfleet"):
            from toolfleet.schemas.settings import Settings

            settings = Settings(broker_url=ctx.broker_url, tools=(fleet_mode.TOOL_MODULE,))
            worker = fleet_mode.worker(ctx.broker_url, "sync", CALLS, f"bench-{label}")
            with worker:
                results.append(_line(label, "toolfleet", calls, shape, framework, settings))
        measured = {r.mode: r for r in results if r.ok}
        base, ours = measured.get("inprocess"), measured.get("toolfleet")
        if base is not None and ours is not None:
            ours.ratios["wall_vs_inprocess"] = ours.wall_s / base.wall_s
            ours.ratios["max_tick_gap_vs_inprocess"] = (
                ours.extra["max_tick_gap_ms"] / base.extra["max_tick_gap_ms"]
            )
        return results

    return run


def _line(
    label: str, mode: str, calls: int, shape: dict[str, Any], framework: Framework, settings: Any
) -> Result:
    executor = framework.executor if settings is None else f"sync worker x{CALLS}"
    extra = {**shape, "executor": executor}
    try:
        wall_s, gaps, batches = _measure(framework, settings)
    except Exception as exc:
        return Result(label, mode, calls, 0.0, extra=extra, error=f"{type(exc).__name__}: {exc}")
    extra["max_tick_gap_ms"] = 1000 * max(gaps)
    extra["p99_tick_gap_ms"] = 1000 * percentile(gaps, 99)
    if batches:
        extra["batches"] = len(batches)
        extra["calls_per_batch"] = sorted(set(batches))
    return Result(label, mode, calls, wall_s, extra=extra)
