"""A raw JSON-RPC client of the 2026-07-28 streamable HTTP protocol, written from the
specification: every envelope key and routing header by hand, so the tests see the bytes a
server sends, not what an SDK makes of them."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx2

__all__ = ["TASKS", "WireClient"]

TASKS = "io.modelcontextprotocol/tasks"
VERSION = "2026-07-28"
_ids = itertools.count(1)


class WireClient:
    """Posts one JSON-RPC request per HTTP request to ``url``."""

    def __init__(self, url: str, token: str | None, *, declare_tasks: bool = True) -> None:
        self.url = url
        self.token = token
        self.declare_tasks = declare_tasks

    def frames(self, method: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Every JSON-RPC message of the answer to ``method``, in order (an SSE stream's
        notifications, then its response)."""
        raw = self._send(method, params, name=None, request_id=None)
        if not raw.headers.get("content-type", "").startswith("text/event-stream"):
            return [json.loads(raw.content)]
        return [json.loads(frame) for frame in _data_frames(raw.text)]

    def post(
        self,
        method: str,
        params: dict[str, Any],
        *,
        name: str | None = None,
        request_id: int | None = None,
    ) -> bytes:
        """The raw body of the answer to ``method`` (the JSON of an SSE stream's message)."""
        reply = self._send(method, params, name=name, request_id=request_id)
        if reply.headers.get("content-type", "").startswith("text/event-stream"):
            answers = [f for f in _data_frames(reply.text) if '"id"' in f]
            return answers[-1].encode()
        return reply.content

    def _send(
        self, method: str, params: dict[str, Any], *, name: str | None, request_id: int | None
    ) -> httpx2.Response:
        extensions = {TASKS: {}} if self.declare_tasks else {}
        body = {
            "jsonrpc": "2.0",
            "id": request_id if request_id is not None else next(_ids),
            "method": method,
            "params": {
                **params,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": VERSION,
                    "io.modelcontextprotocol/clientInfo": {"name": "wire-test", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
                },
            },
        }
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": VERSION,
            "Mcp-Method": method,
        }
        routed = name or params.get("name") or params.get("taskId")
        if routed is not None:
            headers["Mcp-Name"] = str(routed)
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        return httpx2.post(self.url, content=json.dumps(body), headers=headers, timeout=60)

    def call(self, method: str, params: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """The answer to ``method`` as JSON (its ``result`` or its ``error``)."""
        answer: dict[str, Any] = json.loads(self.post(method, params, **kwargs))
        return answer


def _data_frames(text: str) -> list[str]:
    return [
        line[len("data:") :].strip()
        for line in text.splitlines()
        if line.startswith("data:") and line[len("data:") :].strip()
    ]
