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
installed. The measuring, the lines and their ratios are those of ``bench/agent_loops.py``.
"""

from __future__ import annotations

import uuid
from typing import Any

from bench import tools
from bench.agent_loops import CALLS, SLEEP_S, TURNS, Framework, check, workload

__all__ = ["CALLS", "TURNS", "WORKLOAD", "run"]

WORKLOAD = "agent-openai-agents"


async def _agent_run(turns: int, calls: int, fleet: Any) -> list[int]:
    """One agent run of ``turns`` turns of ``calls`` calls; the batch sizes the fleet got."""
    from agents import Agent, Runner, function_tool
    from agents.items import ToolCallOutputItem
    from agents.run_config import RunConfig
    from agents.testing import ScriptedModel, assistant_message, function_call

    from toolfleet.adapters.openai_agents import binding_of, on_fleet

    tag = uuid.uuid4().hex[:8]
    steps: list[Any] = [
        [
            function_call("sleep_sync", {"seconds": SLEEP_S}, call_id=f"{tag}-t{t}-{i}")
            for i in range(calls)
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
    check(outputs, turns * calls, lambda output: output == SLEEP_S)
    binding = binding_of(agent) if fleet is not None else None
    return list(binding.batch_sizes) if binding is not None else []


# The workload: its in-process line and its toolfleet line (with their ratios).
run = workload(
    "openai-agents",
    Framework(
        "agents",
        _agent_run,
        "openai-agents is not installed; pip install '.[openai-agents]'",
        executor="SDK's to_thread in the agent's process",
    ),
)
