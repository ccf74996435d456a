"""MCP tasks in Redis: one hash per task, under the fleet's key prefix, read by any replica.

A task is a handle on one call of the fleet. Its hash holds only what the call's own records
do not: which call it is, who created it (a digest of the caller's credentials), when, for how
long it lives (``ttlMs``, the hash's own expiry), the last progress message, a cancel request,
and, once the creating process saw the call end, the rendered result (bounded). Everything else
a ``tasks/get`` answers is read from the call's records (``toolfleet.adapters.mcp_task_state``).

Task ids are 256 random bits; the hash is keyed by the id's SHA-256, so a reader of Redis cannot
act on a task, and an id from another caller (another token) is unknown.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from toolfleet.broker.lua_scripts import lua_script
from toolfleet.schemas.keys import Keys

__all__ = [
    "CREATOR_BEAT_S",
    "DEFAULT_TTL_MS",
    "MAX_RESULT_BYTES",
    "TaskRecord",
    "TaskStore",
    "bounded_result",
    "owner_of",
]

# How long a task is kept from its creation unless the client asks otherwise (one day), and
# the longest it may ask for (a week): a task is a record, not an archive.
DEFAULT_TTL_MS = 24 * 3600 * 1000
MAX_TTL_MS = 7 * 24 * 3600 * 1000
# A task's creating process says it lives every CREATOR_BEAT_S, for CREATOR_TTL_MS: a
# replica takes over its tasks' approvals and cancels that much after it died.
CREATOR_BEAT_S = 1.0
CREATOR_TTL_MS = 4000
# A stored result above this many bytes of JSON is kept as a preview (its text cut).
MAX_RESULT_BYTES = 256 * 1024
PREVIEW_CHARS = 4096


def owner_of(credentials: str | None) -> str:
    """The digest that binds a task to whoever created it ("" without credentials: stdio, or
    an HTTP server without a token)."""
    if not credentials:
        return ""
    return hashlib.sha256(credentials.encode()).hexdigest()


@dataclass(frozen=True)
class TaskRecord:
    """One task's hash, read back."""

    task_id: str
    call_id: str
    function: str
    branch_id: str
    dispatcher_id: str
    owner: str
    created_at: float
    updated_at: float
    ttl_ms: int
    status_message: str | None = None
    result: dict[str, Any] | None = None
    final_status: str | None = None
    cancel_requested: bool = False

    @property
    def expires_at(self) -> float:
        return self.created_at + self.ttl_ms / 1000


class TaskStore:
    """Create, read and annotate tasks in the fleet's Redis."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._client = client
        self._prefix = keys.prefix

    def key(self, task_id: str) -> str:
        digest = hashlib.sha256(task_id.encode()).hexdigest()
        return f"{self._prefix}:mcp:task:{digest}"

    def creator_key(self, dispatcher_id: str) -> str:
        """String with a short TTL: present while the ``toolfleet mcp`` process whose
        dispatcher is ``dispatcher_id`` runs; its tasks are the fleet's once it is gone."""
        return f"{self._prefix}:mcp:creator:{dispatcher_id}"

    async def beat(self, dispatcher_id: str) -> None:
        await self._client.set(self.creator_key(dispatcher_id), "1", px=CREATOR_TTL_MS)

    async def creator_alive(self, dispatcher_id: str) -> bool:
        return bool(await self._client.exists(self.creator_key(dispatcher_id)))

    def cancel_channel(self) -> str:
        """Pub/sub channel: call ids whose task a client cancelled, for the process running
        the call's act()."""
        return f"{self._prefix}:mcp:task-cancel"

    async def create(
        self,
        *,
        call_id: str,
        function: str,
        branch_id: str,
        dispatcher_id: str,
        owner: str,
        ttl_ms: int | None,
    ) -> TaskRecord:
        """A new task with an unguessable id, stored before it is returned."""
        ttl = DEFAULT_TTL_MS if ttl_ms is None else max(1, min(int(ttl_ms), MAX_TTL_MS))
        now = time.time()
        record = TaskRecord(
            task_id=secrets.token_urlsafe(32),
            call_id=call_id,
            function=function,
            branch_id=branch_id,
            dispatcher_id=dispatcher_id,
            owner=owner,
            created_at=now,
            updated_at=now,
            ttl_ms=ttl,
        )
        fields: dict[str | bytes, str] = {
            "call_id": call_id,
            "function": function,
            "branch_id": branch_id,
            "dispatcher_id": dispatcher_id,
            "owner": owner,
            "created_at": repr(now),
            "updated_at": repr(now),
            "ttl_ms": str(ttl),
        }
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(self.key(record.task_id), mapping=cast(Any, fields))
            pipe.pexpire(self.key(record.task_id), ttl)
            await pipe.execute()
        return record

    async def load(self, task_id: str, owner: str) -> TaskRecord | None:
        """The task ``task_id`` when it exists, has not expired and belongs to ``owner``."""
        raw = await self._client.hgetall(self.key(task_id))
        if not raw:
            return None
        fields = {_text(k): _text(v) for k, v in raw.items()}
        if fields.get("owner", "") != owner or "call_id" not in fields:
            return None
        record = TaskRecord(
            task_id=task_id,
            call_id=fields["call_id"],
            function=fields.get("function", ""),
            branch_id=fields.get("branch_id", ""),
            dispatcher_id=fields.get("dispatcher_id", ""),
            owner=owner,
            created_at=float(fields["created_at"]),
            updated_at=float(fields.get("updated_at") or fields["created_at"]),
            ttl_ms=int(fields["ttl_ms"]),
            status_message=fields.get("status_message"),
            result=json.loads(fields["result"]) if fields.get("result") else None,
            final_status=fields.get("final_status"),
            cancel_requested=fields.get("cancel_requested") == "1",
        )
        if record.expires_at <= time.time():
            return None  # Redis expires it too; a clock a little ahead must not revive it
        return record

    async def annotate(self, task_id: str, **fields: str) -> bool:
        """Set ``fields`` (and ``updated_at``) on an existing task; False when it is gone.

        A script, so a task that expired meanwhile is not recreated without its expiry."""
        args = [repr(time.time())]
        for name, value in fields.items():
            args += [name, value]
        done = await _ANNOTATE.run(self._client, keys=[self.key(task_id)], args=args)
        return bool(done)

    async def finish(self, task_id: str, status: str, result: dict[str, Any] | None) -> bool:
        """Record the task's end as its creating process saw it (a bounded result)."""
        fields = {"final_status": status}
        if result is not None:
            fields["result"] = json.dumps(bounded_result(result), ensure_ascii=False)
        return await self.annotate(task_id, **fields)


# Writes fields only to a task that exists (its KEYS and ARGV: the file's header).
_ANNOTATE = lua_script("mcp_task_annotate")


def bounded_result(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` (a CallToolResult as JSON) when its JSON is at most MAX_RESULT_BYTES; else a
    preview: its first text cut to PREVIEW_CHARS, no structuredContent, and the full size."""
    size = len(json.dumps(result, ensure_ascii=False).encode())
    if size <= MAX_RESULT_BYTES:
        return result
    texts = [c.get("text", "") for c in result.get("content") or [] if c.get("type") == "text"]
    text = texts[0] if texts else ""
    note = (
        f"\n[toolfleet: result of {size} bytes, over the task limit of {MAX_RESULT_BYTES}; "
        "the first characters are shown; the call's record in the branch history has it]"
    )
    meta = dict(result.get("_meta") or {})
    meta["toolfleet/size_bytes"] = size
    return {
        "content": [{"type": "text", "text": text[:PREVIEW_CHARS] + note}],
        "isError": bool(result.get("isError")),
        "_meta": meta,
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
