"""Stand-ins for the OpenAI and Anthropic clients, so the README's agent loops run as printed
with no network (tests/integration/test_readme_loops.py).

Each fake answers the first request with tool calls built as the SDK's own objects
(``ChatCompletion``, ``anthropic.types.Message``) and the next with a text answer naming the
results it was sent. Every request is appended, as JSON, to ``$TOOLFLEET_TEST_FAKE_LOG``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from anthropic.types import Message
from openai.types.chat import ChatCompletion
from pydantic import BaseModel

__all__ = ["CALLS", "FakeAnthropic", "FakeOpenAI", "install"]

# The tool calls the fake model makes, in order: (id, tool, arguments).
CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("call_words", "word_count", {"text": "to be or not to be"}),
    ("call_div", "divide", {"a": 1, "b": 0}),
    ("call_fetch", "fetch", {"url": "https://example.org", "delay_s": 0.1}),
    ("call_me", "whoami", {"token": "sk-123"}),
]


def _log(request: dict[str, Any]) -> int:
    """Append ``request`` to the log; how many requests came before it."""
    path = os.environ["TOOLFLEET_TEST_FAKE_LOG"]
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(request, default=_plain) + "\n")
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f) - 1


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    raise TypeError(f"not JSON: {type(value).__name__}")


class _OpenAICompletions:
    def create(self, **request: Any) -> ChatCompletion:
        turn = _log(request)
        if turn == 0:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                    for call_id, name, arguments in CALLS
                ],
            }
            finish = "tool_calls"
        else:
            seen = [m for m in request["messages"] if _get(m, "role") == "tool"]
            text = "; ".join(f"{_get(m, 'tool_call_id')}={_get(m, 'content')}" for m in seen)
            message, finish = {"role": "assistant", "content": f"answer: {text}"}, "stop"
        return ChatCompletion.model_validate(
            {
                "id": f"chatcmpl-{turn}",
                "object": "chat.completion",
                "created": 0,
                "model": request["model"],
                "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            }
        )


class _OpenAIChat:
    completions = _OpenAICompletions()


class FakeOpenAI:
    """``openai.OpenAI`` without the network: ``client.chat.completions.create``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.chat = _OpenAIChat()


class _AnthropicMessages:
    def create(self, **request: Any) -> Message:
        turn = _log(request)
        if turn == 0:
            content: list[dict[str, Any]] = [{"type": "text", "text": "Let me use the tools."}]
            content += [
                {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
                for call_id, name, arguments in CALLS
            ]
            stop = "tool_use"
        else:
            results = _get(request["messages"][-1], "content")
            text = "; ".join(f"{_get(b, 'tool_use_id')}={_get(b, 'content')}" for b in results)
            content, stop = [{"type": "text", "text": f"answer: {text}"}], "end_turn"
        return Message.model_validate(
            {
                "id": f"msg_{turn}",
                "type": "message",
                "role": "assistant",
                "model": request["model"],
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
                "content": content,
            }
        )


class FakeAnthropic:
    """``anthropic.Anthropic`` without the network: ``client.messages.create``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.messages = _AnthropicMessages()


def _get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def install() -> None:
    """Make ``from openai import OpenAI`` / ``from anthropic import Anthropic`` the fakes."""
    import anthropic
    import openai

    openai.OpenAI = FakeOpenAI  # type: ignore[misc, assignment]
    anthropic.Anthropic = FakeAnthropic  # type: ignore[misc, assignment]
