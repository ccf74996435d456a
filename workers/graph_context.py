"""LangGraph's run-time functions in a tool on a worker.

A tool written for LangGraph may call ``get_stream_writer()``: under ``ToolNode`` its writes
reach the graph's ``custom`` stream. On a worker there is no graph run, so while a call's
tool runs (in a worker that has LangGraph loaded, because a tool module imported it) this
gives it one with a stream writer only: each write is a progress report of the call
(``current_call().progress``), its message the JSON ``{"langgraph_custom": <chunk>}``, which
``FleetToolNode`` hands to the graph's stream writer. So writes arrive as progress does: at
most 10 a second, the latest kept (docs/controls.md). A chunk that is not JSON, or longer than
a progress message, is refused where it is written.

``interrupt()`` works as in a node that LangGraph re-runs on resume: the call carries the
resume values given so far (``FleetToolNode`` sends them, :data:`GRAPH_RESUME_KEY`), the k-th
``interrupt()`` of the run returns the k-th of them, and the first one with none left stops
the tool: its call fails with :class:`ToolInterruptedError` (fields ``index`` and ``value``),
which the node turns into LangGraph's own ``interrupt(value)`` in the graph. Everything else
of a graph run (its state, its store) is absent: using it fails in the tool.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from toolfleet.schemas.errors import ConfigurationError, ToolInterruptedError
from toolfleet.schemas.progress import MESSAGE_MAX_CHARS

__all__ = ["CUSTOM_STREAM_KEY", "graph_context", "interrupted"]

# The key of a progress message that carries a write to LangGraph's custom stream.
CUSTOM_STREAM_KEY = "langgraph_custom"


@contextlib.contextmanager
def graph_context(progress: Callable[..., None], resume: Any = None) -> Iterator[None]:
    """While the block runs, ``langgraph.config.get_stream_writer()`` writes through
    ``progress`` (a call's ``CurrentCall.progress``) and ``interrupt()`` returns the values of
    ``resume`` (a list) in turn; nothing at all when LangGraph is not loaded in this process."""
    if "langgraph" not in sys.modules:
        yield
        return
    try:
        from langchain_core.runnables.config import var_child_runnable_config
        from langgraph._internal._constants import (
            CONFIG_KEY_CHECKPOINT_NS,
            CONFIG_KEY_RUNTIME,
            CONFIG_KEY_SCRATCHPAD,
            CONFIG_KEY_SEND,
        )
        from langgraph._internal._scratchpad import PregelScratchpad
        from langgraph.runtime import Runtime
    except ImportError:  # another LangGraph: its run-time functions stay unavailable
        yield
        return
    count = itertools.count(1)

    def write(chunk: Any) -> None:
        text = json.dumps({CUSTOM_STREAM_KEY: chunk})  # TypeError for a chunk not JSON
        if len(text) > MESSAGE_MAX_CHARS:
            raise ConfigurationError(
                f"a write to LangGraph's stream from a tool on a worker is at most "
                f"{MESSAGE_MAX_CHARS:,} characters of JSON, got {len(text):,}; write less at "
                "a time"
            )
        progress(next(count), message=text)

    # A node run's scratchpad as LangGraph keeps one: interrupt() counts its calls and takes
    # the resume values by place; with none left it raises GraphInterrupt (see interrupted).
    scratchpad = PregelScratchpad(
        step=0,
        stop=0,
        call_counter=itertools.count().__next__,
        interrupt_counter=itertools.count().__next__,
        get_null_resume=_no_resume,
        resume=list(resume) if isinstance(resume, list) else [],
        subgraph_counter=itertools.count().__next__,
    )
    configurable = {
        CONFIG_KEY_RUNTIME: Runtime(stream_writer=write),
        CONFIG_KEY_SCRATCHPAD: scratchpad,
        CONFIG_KEY_SEND: lambda writes: None,  # a worker has no checkpoint to write to
        CONFIG_KEY_CHECKPOINT_NS: "",
    }
    config: Any = {"configurable": configurable}
    token = var_child_runnable_config.set(config)
    try:
        yield
    finally:
        var_child_runnable_config.reset(token)


def interrupted(error: Any, resume: Any = None) -> ToolInterruptedError | None:
    """``error`` as :class:`ToolInterruptedError` when it is LangGraph's pause of a tool's
    ``interrupt()`` (``GraphInterrupt``) in a run given ``resume``; None for anything else."""
    errors = sys.modules.get("langgraph.errors")
    graph_interrupt = getattr(errors, "GraphInterrupt", None)
    if not isinstance(graph_interrupt, type) or not isinstance(error, graph_interrupt):
        return None
    args = getattr(error, "args", ())
    raised = args[0] if args else ()
    pause = raised[0] if isinstance(raised, (list, tuple)) and raised else None
    value = getattr(pause, "value", None)
    # The interrupt() calls before it returned a resume value each: it is the next one.
    index = len(resume) if isinstance(resume, list) else 0
    return ToolInterruptedError(
        f"the tool called interrupt({value!r}) and waits for Command(resume=...)",
        index=index,
        value=value,
    )


def _no_resume(consume: bool = False) -> Any:
    """A worker has no resume value beyond those its call carries."""
    return None
