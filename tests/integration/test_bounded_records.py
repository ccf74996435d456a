"""A refused call keeps a preview of its arguments (at most 1 KB, with the full size), never
the payload: in the returned result, the Redis history and the batch journal; `toolfleet
history` shows a branch's first or last calls. Only refused calls are sent, so the batch
never needs a worker and can use a key prefix of its own."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.cli_support import toolfleet
from tests.support.fleet import call, run
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel
from toolfleet.schemas.record import PREVIEW_KEY, SIZE_KEY
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

PAYLOAD_BYTES = 2_000_000


@pytest.fixture()
def own_prefix(redis_url: str, redis_client: redis.Redis) -> Iterator[Settings]:
    settings = Settings(
        broker_url=redis_url,
        key_prefix=f"bounded-{uuid.uuid4().hex[:8]}",
        tools=("tests.support.sample_tools",),
    )
    yield settings
    for key in redis_client.scan_iter(f"{settings.key_prefix}:*"):
        redis_client.delete(key)


def _bytes_under(client: redis.Redis, prefix: str) -> int:
    return sum(client.memory_usage(key) or 0 for key in client.scan_iter(f"{prefix}:*"))


def test_a_refused_payload_is_kept_as_a_bounded_preview(
    own_prefix: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    openai_text = '{"path": "/tmp/x", "text": "' + "q" * 5000  # cut off: not JSON

    async def scenario(fleet: Fleet) -> tuple[str, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        results = await branch.act(
            [
                call("echo", value="z" * PAYLOAD_BYTES),  # over max_argument_bytes
                {"id": "call_1", "type": "function",
                 "function": {"name": "append_line", "arguments": openai_text}},
                call("add", a="not a number", b=1),
            ]
        )  # fmt: skip
        return branch.id, results

    branch_id, results = run(own_prefix, scenario)
    assert [r.status for r in results] == [EventStatus.ABORTED] * 3
    oversized, malformed, mistyped = results
    assert oversized.error is not None and "OversizedArgumentsError" in oversized.error
    assert oversized.arguments[SIZE_KEY] > PAYLOAD_BYTES
    assert len(json.dumps(oversized.arguments)) < 1200
    assert len(json.dumps(oversized.model_dump(mode="json"))) < 4000
    # The model's text that was not JSON survives as a bounded preview, not as {}.
    assert malformed.arguments[PREVIEW_KEY].startswith('{"path": "/tmp/x", "text": "qqq')
    assert malformed.arguments[SIZE_KEY] == len(openai_text)
    assert mistyped.arguments == {"a": "not a number", "b": 1}  # small: kept whole
    # Nothing of the payload in Redis: history, records and the batch journal together.
    assert _bytes_under(redis_client, own_prefix.key_prefix) < 64_000

    # toolfleet history shows the first or the last calls only.
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "TOOLFLEET_BROKER_URL": str(own_prefix.broker_url),
        "TOOLFLEET_KEY_PREFIX": own_prefix.key_prefix,
    }
    shown = toolfleet("history", branch_id, "--json", "--tail", "1", home=home, env=env)
    assert shown.returncode == 0, shown.stderr
    messages = json.loads(shown.stdout)["messages"]
    assert [m["content"]["function"] for m in messages] == ["add", "add"]
    first = toolfleet("history", branch_id, "--limit", "1", home=home, env=env)
    assert first.returncode == 0, first.stderr
    assert "echo" in first.stdout and "append_line" not in first.stdout
    assert len(first.stdout) < 20_000
    wrong = toolfleet("history", branch_id, "--tail", "0", home=home, env=env)
    assert wrong.returncode == 2 and "'0' is not a number of calls" in wrong.stderr
