"""LangGraph's run-time functions in a tool on a worker.

A tool written for LangGraph may call ``get_stream_writer()``: under ``ToolNode`` its writes
reach the graph's ``custom`` stream. On a worker there is no graph run, so while a call's
tool runs (in a worker that has LangGraph loaded, because a tool module imported it) this
gives it one with a stream writer only: each write is a progress report of the call
(``current_call().progress``), its message the JSON ``{"langgraph_custom": <chunk>}``, which
``FleetToolNode`` hands to the graph's stream writer. So writes arrive as progress does: at
most 10 a second, the latest kept (docs/controls.md). A chunk that is not JSON, or longer than
a progress message, is refused where it is written. Everything else of a graph run (its
state, ``interrupt()``, its store) is absent, as before: using it fails in the tool.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.progress import MESSAGE_MAX_CHARS

__all__ = ["CUSTOM_STREAM_KEY", "graph_context"]

# The key of a progress message that carries a write to LangGraph's custom stream.
CUSTOM_STREAM_KEY = "langgraph_custom"


@contextlib.contextmanager
def graph_context(progress: Callable[..., None]) -> Iterator[None]:
    """While the block runs, ``langgraph.config.get_stream_writer()`` writes through
    ``progress`` (a call's ``CurrentCall.progress``); nothing at all when LangGraph is not
    loaded in this process."""
    if "langgraph" not in sys.modules:
        yield
        return
    try:
        from langchain_core.runnables.config import var_child_runnable_config
        from langgraph._internal._constants import CONFIG_KEY_RUNTIME
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

    config: Any = {"configurable": {CONFIG_KEY_RUNTIME: Runtime(stream_writer=write)}}
    token = var_child_runnable_config.set(config)
    try:
        yield
    finally:
        var_child_runnable_config.reset(token)
