"""Scripted models for two agent frameworks' own MCP clients: each asks for one tool call
(``append_line``), then answers with the tool's result. No network, no provider."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from agent_framework import BaseChatClient, ChatResponse, Content, FunctionInvocationLayer, Message
from strands.models.model import Model

__all__ = ["ScriptedAgentFrameworkClient", "ScriptedStrandsModel"]


class ScriptedAgentFrameworkClient(FunctionInvocationLayer[Any], BaseChatClient[Any]):
    """A Microsoft Agent Framework chat client: first turn a function call, then text."""

    def __init__(self, arguments: Mapping[str, Any]) -> None:
        super().__init__()
        self.arguments = dict(arguments)
        self.offered: list[str] = []

    async def _inner_get_response(  # type: ignore[override]
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **_: Any
    ) -> ChatResponse:
        self.offered = [getattr(t, "name", "") for t in options.get("tools") or []]
        results = [c for m in messages for c in m.contents if c.type == "function_result"]
        if not results:
            call = Content.from_function_call("call-1", "append_line", arguments=self.arguments)
            return ChatResponse(messages=[Message(role="assistant", contents=[call])])
        text = f"the file has {results[0].result} line(s)"
        return ChatResponse(messages=[Message(role="assistant", contents=[text])])


class ScriptedStrandsModel(Model):
    """A Strands model: first turn a toolUse, then text."""

    def __init__(self, arguments: Mapping[str, Any]) -> None:
        self.arguments = dict(arguments)
        self.offered: list[str] = []

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    async def structured_output(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise NotImplementedError("the scripted model answers in text")

    async def stream(  # type: ignore[override]
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **_: Any
    ) -> AsyncIterator[Any]:
        import json

        self.offered = [spec["name"] for spec in tool_specs or []]
        results = [b["toolResult"] for m in messages for b in m["content"] if "toolResult" in b]
        yield {"messageStart": {"role": "assistant"}}
        if not results:
            start = {"toolUse": {"toolUseId": "use-1", "name": "append_line"}}
            yield {"contentBlockStart": {"start": start}}
            delta = {"toolUse": {"input": json.dumps(self.arguments)}}
            yield {"contentBlockDelta": {"delta": delta}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
            return
        text = results[0]["content"][0]["text"]
        yield {"contentBlockDelta": {"delta": {"text": f"the file has {text} line(s)"}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "end_turn"}}
