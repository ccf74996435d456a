"""The pure parts of the MCP task store: stored results are bounded, owners are digests."""

from __future__ import annotations

import json

from toolfleet.adapters.mcp_task_store import MAX_RESULT_BYTES, bounded_result, owner_of


def test_a_result_within_the_limit_is_kept_whole() -> None:
    result = {"content": [{"type": "text", "text": "x" * 1000}], "isError": False}
    assert bounded_result(result) is result


def test_a_result_over_the_limit_is_a_preview_that_says_its_size() -> None:
    text = "y" * (MAX_RESULT_BYTES + 10)
    result = {
        "content": [{"type": "text", "text": text}],
        "structuredContent": {"big": text},
        "isError": False,
        "_meta": {"toolfleet/call_id": "c1"},
    }
    preview = bounded_result(result)
    assert len(json.dumps(preview).encode()) < 10_000
    assert "structuredContent" not in preview
    assert preview["content"][0]["text"].startswith("y" * 100)
    assert "over the task limit" in preview["content"][0]["text"]
    assert preview["_meta"]["toolfleet/call_id"] == "c1"
    assert preview["_meta"]["toolfleet/size_bytes"] > MAX_RESULT_BYTES


def test_owners_are_digests_and_no_credentials_is_the_empty_owner() -> None:
    assert owner_of(None) == owner_of("") == ""
    assert owner_of("Bearer a") != owner_of("Bearer b")
    assert "Bearer" not in owner_of("Bearer a") and len(owner_of("Bearer a")) == 64
