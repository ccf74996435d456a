"""The worker's ``toolfleet.tool <function>`` span of a tool that raised is ERROR, with the
exception recorded as its ``exception`` event; a tool with secret arguments records the
exception's type and frames but not its message, which may quote a secret.

Real sync and async workers export their spans over OTLP/HTTP to the collector the tracing
tests use (tests/support/otlp_collector.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.fleet import WorkerProcess, call, own_queues, run, start_worker
from tests.support.otlp_collector import OtlpCollector, ReceivedSpan
from tests.support.waiting import until
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus

TOOLS = ("tests.support.sample_tools", "tests.support.traced_tools")
SECRET = f"sk-span-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpCollector]:
    with OtlpCollector() as running:
        yield running


@pytest.fixture(scope="module")
def traced_fleet(
    fleet_settings: Settings, redis_url: str, collector: OtlpCollector
) -> Iterator[Settings]:
    settings, queues_env = own_queues(fleet_settings, "toolspan", tools=TOOLS)
    env = {
        **queues_env,
        **collector.worker_env(),
        # Sampled whatever the caller decided: a test process whose TracerProvider samples
        # nothing (test_tracing.py's, between its tests) sends non-sampled parents.
        "OTEL_TRACES_SAMPLER": "always_on",
    }
    started: list[WorkerProcess] = []
    try:
        for kind, concurrency in (("sync", 2), ("async", 20)):
            started.append(
                start_worker(
                    kind, redis_url=redis_url, tools=TOOLS, concurrency=concurrency, env=env
                )
            )
        yield settings
    finally:
        for worker in started:
            worker.stop()


def _tool_spans(
    collector: OtlpCollector, results: list[ActionResponseModel]
) -> dict[str, ReceivedSpan]:
    """Each call's ``toolfleet.tool`` span (the child of its worker span), by call id."""
    call_ids = {str(r.call_id) for r in results}

    def found() -> dict[str, ReceivedSpan] | None:
        spans = collector.snapshot()
        workers = {
            s.span_id: str(s.attributes["toolfleet.call_id"])
            for s in spans
            if s.name.startswith("toolfleet.worker ")
            and str(s.attributes.get("toolfleet.call_id")) in call_ids
        }
        tools = {
            workers[s.parent_span_id]: s
            for s in spans
            if s.name.startswith("toolfleet.tool ") and s.parent_span_id in workers
        }
        return tools if set(tools) == call_ids else None

    tools: dict[str, ReceivedSpan] | None = until(found, timeout_s=20, what=collector.names)
    assert tools is not None
    return tools


def test_the_span_of_a_tool_that_raised_is_error_with_the_exception_recorded(
    traced_fleet: Settings, collector: OtlpCollector
) -> None:
    requests = [
        call("fail", message="nope"),  # prefork
        call("fail_async", message="nope async"),  # asyncio pool
        call("fail_quoting_secret", api_key=SECRET),  # a secret argument in the error's text
        call("add", a=1, b=2),
    ]

    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        return await Branch(fleet=fleet).act(requests, call_params=CallParams(timeout_s=20))

    results = run(traced_fleet, scenario)
    assert [r.status for r in results] == [EventStatus.FAILED] * 3 + [EventStatus.COMPLETED]
    spans = _tool_spans(collector, results)
    failed, failed_async, secret, added = (spans[str(r.call_id)] for r in results)

    for span, message in ((failed, "nope"), (failed_async, "nope async")):
        assert span.status == "ERROR"
        ((name, event),) = span.events
        assert name == "exception"
        assert event["exception.type"] == "ValueError"
        assert event["exception.message"] == message
        assert f"ValueError: {message}" in event["exception.stacktrace"]
        assert "sample_tools.py" in event["exception.stacktrace"]  # where the tool raised

    assert secret.status == "ERROR"
    ((name, event),) = secret.events
    assert name == "exception" and event["exception.type"] == "PermissionError"
    assert "exception.message" not in event
    assert "traced_tools.py" in event["exception.stacktrace"]
    assert SECRET not in str(secret.events) and SECRET not in str(secret.attributes)

    assert added.status == "UNSET" and added.events == []
