"""Property-based fuzz over whole JSONL batch files, through the real
``toolfleet run`` path (bytes parsed line by line, one ``act()`` on real workers, results
streamed as they are written).

Each generated file mixes valid calls (each with its own token) and hostile lines: lone
surrogates as JSON escapes (in a value, in an argument name, in the function name), integers
of thousands of digits, nesting past the depth bound, bytes that are not UTF-8, lines over the
size bound, JSON-string arguments, unknown tools, truncated JSON. Whatever the mix: every line
has exactly one result, every valid call's result is present and right, no bad line fails its
neighbours, the streamed results equal the final ones, and Redis holds a linked pair per call.
(Non-string keys and raising ``repr()`` cannot be written in JSON; the envelope fuzz in
tests/integration/test_bad_input_batch.py covers them.)
"""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet.cli.batch_file import parse_batch_bytes
from toolfleet.cli.batch_runner import run_batch
from toolfleet.cli.call_record import CallRecord
from toolfleet.dispatcher.fleet import Fleet
from toolfleet.dispatcher.history.history import load_records
from toolfleet.schemas.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("sync_worker", "async_worker")]

MAX_ARGUMENT_BYTES = 4096
MAX_LINE_BYTES = 2 * MAX_ARGUMENT_BYTES + 4096


def _line(obj: str) -> bytes:
    return obj.encode()


hostile_lines = st.sampled_from(
    [
        # Lone surrogates, written as JSON escapes (valid JSON text, not valid Unicode).
        _line(r'{"function": "echo", "arguments": {"value": "\ud800"}}'),
        _line(r'{"function": "echo", "arguments": {"va\udfffl": 1}}'),
        _line(r'{"function": "ec\udc80ho", "arguments": {}}'),
        _line(r'{"function": "echo", "arguments": "{\"value\": \"\\ud800\"}"}'),
        # Integers far past 64 bits, and past Python's int-from-string limit.
        _line('{"function": "echo", "arguments": {"value": ' + "9" * 40 + "}}"),
        _line('{"function": "echo", "arguments": {"value": ' + "7" * 5000 + "}}"),
        # Nesting past the depth bound, and deep enough to blow a recursive parser.
        _line('{"function": "echo", "arguments": {"value": ' + "[" * 200 + "]" * 200 + "}}"),
        _line('{"function": "echo", "arguments": {"value": ' + "[" * 10_000 + "]" * 10_000 + "}}"),
        # Not UTF-8.
        b'{"function": "echo", "arguments": {"value": "\xff\xfe"}}',
        # Over the line bound (refused before it is parsed whole).
        _line('{"function": "echo", "arguments": {"value": "' + "x" * MAX_LINE_BYTES + '"}}'),
        # Over the argument bound, under the line bound.
        _line(
            '{"function": "echo", "arguments": {"value": "'
            + "y" * (MAX_ARGUMENT_BYTES + 10)
            + '"}}'
        ),
        _line('{"function": "no_such_tool", "arguments": {"v": 1}}'),
        _line('{"function": "echo", "arguments": "not json"}'),
        _line('{"function": "echo", "arguments": {"value": 1'),
        _line('["not", "an", "object"]'),
        _line("null"),
    ]
)


@st.composite
def batches(draw: st.DrawFn) -> tuple[bytes, list[str | None]]:
    """A file and, per line, the token its valid call echoes (None for a hostile line)."""
    bad = draw(st.lists(hostile_lines, min_size=1, max_size=5))
    tokens: list[str | None] = [None] * len(bad)
    lines: list[bytes] = list(bad)
    for n in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines)))
        token = f"ok-{n}-{draw(st.integers(0, 10**6))}"
        lines.insert(at, json.dumps({"function": "echo", "arguments": {"value": token}}).encode())
        tokens.insert(at, token)
    return b"\n".join(lines) + b"\n", tokens


@pytest.fixture(scope="module")
def batch_settings(fleet_settings: Settings) -> Settings:
    return fleet_settings.model_copy(
        update={"max_argument_bytes": MAX_ARGUMENT_BYTES, "tools": ("tests.support.sample_tools",)}
    )


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=batches())
def test_every_jsonl_line_gets_one_result_and_valid_calls_all_finish(
    batch_settings: Settings, batch: tuple[bytes, list[str | None]]
) -> None:
    text, tokens = batch
    lines = parse_batch_bytes(io.BytesIO(text), max_line_bytes=MAX_LINE_BYTES)
    assert [line.line_no for line in lines] == list(range(1, len(tokens) + 1))
    streamed: list[CallRecord] = []

    async def scenario() -> tuple[list[CallRecord], int]:
        result = await run_batch(lines, settings=batch_settings, on_record=streamed.append)
        fleet = Fleet(batch_settings)
        try:
            messages, _ = await load_records(fleet.redis, fleet.keys, result.branch_id)
        finally:
            await fleet.aclose()
        return result.records, len(messages)

    records, stored = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [r.line_no for r in records] == list(range(1, len(tokens) + 1))
    for record, token in zip(records, tokens, strict=True):
        if token is not None:
            assert record.outcome == "done" and record.output == token, record
        else:
            assert record.outcome in ("malformed", "failed"), record
            assert record.error, record
    # Streamed as written: the same records, calls only, in input order.
    calls = [r for r in records if r.outcome != "malformed"]
    assert [r.to_json() for r in streamed] == [
        {**r.to_json(), "duration_s": s.duration_s} for r, s in zip(calls, streamed, strict=True)
    ]
    # A linked request/response pair in Redis for every line that became a call.
    assert stored == 2 * len(calls)
