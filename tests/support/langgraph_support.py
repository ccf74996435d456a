"""What the LangGraph adapter's tests share: a scripted chat model (no network), a turn of
tool calls, the classic agent loop around a tools node, and a recorder of every command Redis
receives while a scenario runs."""

from __future__ import annotations

import base64
import binascii
import re
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableLambda
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

__all__ = ["ScriptedChatModel", "agent_loop", "calls", "carries", "redis_traffic"]


class ScriptedChatModel(BaseChatModel):
    """Answers with the given AIMessages in turn; records what it was sent and bound."""

    replies: list[AIMessage]
    seen: list[list[BaseMessage]] = []
    bound: list[dict[str, Any]] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        reply = self.replies[len(self.seen) - 1]
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Sequence[Any], **_: Any) -> ScriptedChatModel:  # type: ignore[override]
        self.bound.extend(convert_to_openai_tool(t) for t in tools)
        return self


def calls(*specs: tuple[str, dict[str, Any], str]) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in specs])


def agent_loop(
    model: Any,
    node: ToolNode,
    state: type[Any] = MessagesState,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
) -> Any:
    """The classic loop, agent → tools_condition → tools → agent, compiled; its agent node
    runs under graph.invoke/stream and graph.ainvoke alike."""

    def agent(values: Any) -> dict[str, Any]:
        return {"messages": [model.invoke(values["messages"])]}

    async def aagent(values: Any) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(values["messages"])]}

    builder = StateGraph(state)
    builder.add_node("agent", RunnableLambda(agent, afunc=aagent))
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


@contextmanager
def redis_traffic(redis_url: str) -> Iterator[list[bytes]]:
    """Every command the Redis server of ``redis_url`` receives (any database, any client:
    the dispatcher's messages, the workers' records and events) until the block ends, as
    MONITOR shows them — what Flower and anyone reading Redis could ever see."""
    client = redis.Redis.from_url(redis_url)
    seen: list[bytes] = []
    stop = f"toolfleet-traffic-end-{uuid.uuid4().hex}"
    listening = threading.Event()

    def record() -> None:
        with client.monitor() as monitor:
            listening.set()
            for command in monitor.listen():
                line = str(command.get("command", ""))
                if stop in line:
                    return
                seen.append(line.encode())

    thread = threading.Thread(target=record, name="redis-traffic", daemon=True)
    thread.start()
    if not listening.wait(10):
        raise TimeoutError("Redis MONITOR did not start within 10 s")
    try:
        yield seen
    finally:
        redis.Redis.from_url(redis_url).echo(stop)
        thread.join(10)
        client.close()


_BASE64 = re.compile(rb"[A-Za-z0-9+/]{16,}={0,2}")


def carries(blob: bytes | str, marker: str) -> bool:
    """``marker`` is in ``blob`` as is or inside base64 (kombu's message bodies), at any depth."""
    data = blob.encode() if isinstance(blob, str) else blob
    if marker.encode() in data:
        return True
    for run in _BASE64.findall(data):
        try:
            decoded = base64.b64decode(run + b"=" * (-len(run) % 4))
        except (binascii.Error, ValueError):
            continue
        if decoded != data and carries(decoded, marker):
            return True
    return False
