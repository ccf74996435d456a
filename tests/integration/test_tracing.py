"""OpenTelemetry: one trace from act() through the broker to the worker and back.

The test process records its spans with the SDK's in-memory exporter; the real worker
processes export theirs over OTLP/HTTP to a tiny collector in this process
(tests/support/otlp_collector.py), configured by the standard OTEL_* variables, exactly as an
operator would point them at a real collector.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    SamplingResult,
)

from tests.support.fleet import REPO_ROOT, WorkerProcess, call, own_queues, run, start_worker
from tests.support.otlp_collector import OtlpCollector, ReceivedSpan
from tests.support.waiting import until
from toolfleet.dispatcher import Branch, Fleet, Session
from toolfleet.schemas.action import ActionResponseModel, CallParams
from toolfleet.schemas.settings import Settings
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.tracing import configure_from_env

SECRET = f"sk-trace-{uuid.uuid4().hex}"
_exporter: InMemorySpanExporter | None = None


class _WhileTesting(Sampler):
    """Records spans only while a test here runs: the global TracerProvider outlives this
    module, and the rest of the suite should neither pay for spans nor keep them."""

    on = False

    def should_sample(self, parent_context: Any, *args: Any, **kwargs: Any) -> SamplingResult:
        sampler = _SAMPLE if self.on else _DROP
        return sampler.should_sample(parent_context, *args, **kwargs)

    def get_description(self) -> str:
        return "toolfleet-tests"


_SAMPLE = ParentBased(ALWAYS_ON)
_DROP = ALWAYS_OFF
_sampler = _WhileTesting()


def memory_exporter() -> InMemorySpanExporter:
    """This process's in-memory exporter (a global TracerProvider can be set only once)."""
    global _exporter
    if _exporter is None:
        _exporter = InMemorySpanExporter()
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider(sampler=_sampler)
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
    return _exporter


@pytest.fixture()
def exporter() -> Iterator[InMemorySpanExporter]:
    """The in-memory exporter, recording for this test only."""
    recorder = memory_exporter()
    recorder.clear()
    _sampler.on = True
    try:
        yield recorder
    finally:
        _sampler.on = False
        recorder.clear()


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpCollector]:
    with OtlpCollector() as running:
        yield running


@pytest.fixture(scope="module")
def traced_fleet(
    fleet_settings: Settings, redis_url: str, collector: OtlpCollector
) -> Iterator[Settings]:
    """A sync and an async worker on queues of their own, exporting spans to ``collector``."""
    settings, queues_env = own_queues(fleet_settings, "traced")
    env = {**queues_env, **collector.worker_env()}
    started: list[WorkerProcess] = []
    try:
        started.append(start_worker("sync", redis_url=redis_url, concurrency=2, env=env))
        # The async worker gets the README's recipe instead: the collector's base URL in the
        # generic OTEL_EXPORTER_OTLP_ENDPOINT (the exporter appends /v1/traces). Its spans
        # arriving is the check that the README's variables work.
        readme_env = {k: v for k, v in env.items() if k != "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}
        readme_env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.endpoint.removesuffix("/v1/traces")
        started.append(start_worker("async", redis_url=redis_url, concurrency=50, env=readme_env))
        yield settings
    finally:
        for worker in started:
            worker.stop()


def _by_call(spans: list[ReceivedSpan], name_prefix: str) -> dict[str, ReceivedSpan]:
    return {
        str(s.attributes["toolfleet.call_id"]): s
        for s in spans
        if s.name.startswith(name_prefix) and "toolfleet.call_id" in s.attributes
    }


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> dict[str, ReceivedSpan]:
    return {s.name.split(" ")[0]: s for s in spans if s.parent_span_id == parent.span_id}


def _received(span: ReadableSpan) -> ReceivedSpan:
    ctx = span.get_span_context()
    assert ctx is not None
    parent = span.parent
    return ReceivedSpan(
        name=span.name,
        trace_id=f"{ctx.trace_id:032x}",
        span_id=f"{ctx.span_id:016x}",
        parent_span_id=f"{parent.span_id:016x}" if parent is not None else None,
        status=span.status.status_code.name,
        attributes=dict(span.attributes or {}),
        description=span.status.description or "",
    )


def test_one_trace_from_act_through_the_workers_to_the_history_write(
    traced_fleet: Settings, collector: OtlpCollector, exporter: InMemorySpanExporter
) -> None:
    requests = [
        {  # sync, prefork; an OpenAI tool call, so its tool_call_id is kept end to end
            "id": "call_trace_1",
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
        },
        call("sleep_async", seconds=0.01),  # async pool
        call("fail", message="nope"),  # fails on the worker
        call("with_secret", query="q", api_key=SECRET),  # secret argument
    ]

    async def scenario(fleet: Fleet) -> tuple[Branch, list[ActionResponseModel]]:
        branch = Branch(fleet=fleet)
        return branch, await branch.act(requests, call_params=CallParams(timeout_s=20))

    branch, results = run(traced_fleet, scenario)
    assert [r.status for r in results] == [
        EventStatus.COMPLETED,
        EventStatus.COMPLETED,
        EventStatus.FAILED,
        EventStatus.COMPLETED,
    ]
    call_ids = [r.call_id for r in results]

    local = [_received(s) for s in exporter.get_finished_spans()]
    (act,) = [s for s in local if s.name == "toolfleet.act"]
    assert act.parent_span_id is None
    assert act.attributes["toolfleet.branch_id"] == branch.id
    calls = _by_call(local, "toolfleet.call ")
    assert set(calls) == set(call_ids)
    for result in results:
        span = calls[str(result.call_id)]
        assert span.trace_id == act.trace_id and span.parent_span_id == act.span_id
        assert span.name == f"toolfleet.call {result.function}"
        assert span.attributes["toolfleet.function"] == result.function
        assert span.attributes["toolfleet.status"] == result.status.value
        assert span.attributes["toolfleet.attempt"] == 0
        assert str(span.attributes["toolfleet.worker"]).startswith(
            "sync-" if result.function != "sleep_async" else "async-"
        )
    assert calls[str(results[2].call_id)].status == "ERROR"
    # The error's type, from the result's structure (never its message: it may quote values).
    assert calls[str(results[2].call_id)].description == "ValueError"
    assert calls[str(results[0].call_id)].status == "OK"
    writes = [s for s in local if s.name == "toolfleet.history.write"]
    assert writes and all(w.parent_span_id == act.span_id for w in writes)
    assert sum(int(w.attributes["toolfleet.calls"]) for w in writes) == len(requests)

    # The workers' spans crossed the broker: same trace, each a child of its call's span.
    remote = until(
        lambda: collector.spans_where(
            lambda spans: (
                set(_by_call(spans, "toolfleet.worker ")) >= set(call_ids)
                and sum(s.name == "toolfleet.record" for s in spans if s.trace_id == act.trace_id)
                >= len(call_ids)
            )
        ),
        timeout_s=20,
        what=collector.names,
    )
    remote = [s for s in remote if s.trace_id == act.trace_id]
    workers = _by_call(remote, "toolfleet.worker ")
    for result in results:
        worker_span = workers[str(result.call_id)]
        dispatcher_span = calls[str(result.call_id)]
        assert worker_span.parent_span_id == dispatcher_span.span_id
        assert worker_span.attributes["toolfleet.status"] == result.status.value
        assert (
            worker_span.attributes["toolfleet.worker"]
            == dispatcher_span.attributes["toolfleet.worker"]
        )
        assert worker_span.service.startswith("toolfleet-worker-")
        steps = _children(remote, worker_span)
        assert {"toolfleet.queue_wait", "toolfleet.tool", "toolfleet.record"} <= set(steps)
        wait, run_, record = (
            steps["toolfleet.queue_wait"],
            steps["toolfleet.tool"],
            steps["toolfleet.record"],
        )
        assert wait.end_ns <= run_.start_ns <= run_.end_ns <= record.start_ns
    assert calls[str(results[0].call_id)].attributes["toolfleet.tool_call_id"] == "call_trace_1"
    assert workers[str(results[0].call_id)].attributes["toolfleet.tool_call_id"] == "call_trace_1"
    # Without a provider id, a call's tool_call_id is its call_id.
    plain = calls[str(results[1].call_id)].attributes
    assert plain["toolfleet.tool_call_id"] == results[1].tool_call_id
    failed = workers[str(results[2].call_id)]
    assert failed.status == "ERROR"
    assert _children(remote, failed)["toolfleet.tool"].name == "toolfleet.tool fail"
    assert workers[str(results[0].call_id)].status == "OK"

    # A secret argument's value is in no attribute on either side of the broker.
    for span in [*local, *remote]:
        assert all(SECRET not in str(value) for value in span.attributes.values()), span.name


def test_batched_calls_each_join_their_own_call_span(
    traced_fleet: Settings, collector: OtlpCollector, exporter: InMemorySpanExporter
) -> None:
    requests = [call("add", a=i, b=1) for i in range(3)]

    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        return await Branch(fleet=fleet).act(
            requests, call_params=CallParams(timeout_s=20, bundle_size=3)
        )

    results = run(traced_fleet, scenario)
    assert [r.output for r in results] == [1, 2, 3]
    calls = _by_call([_received(s) for s in exporter.get_finished_spans()], "toolfleet.call ")
    ids = {str(r.call_id) for r in results}
    remote = until(
        lambda: collector.spans_where(
            lambda spans: set(_by_call(spans, "toolfleet.worker ")) >= ids
        ),
        timeout_s=20,
        what=collector.names,
    )
    workers = _by_call(remote, "toolfleet.worker ")
    for call_id in ids:
        assert workers[call_id].parent_span_id == calls[call_id].span_id
        assert workers[call_id].trace_id == calls[call_id].trace_id


def test_a_denied_call_has_an_unset_status_and_never_reaches_a_worker(
    traced_fleet: Settings, exporter: InMemorySpanExporter
) -> None:

    async def scenario(fleet: Fleet) -> list[ActionResponseModel]:
        session = Session(fleet)
        session.gate(lambda invocation: False)
        return await session.new_branch().act([call("add", a=1, b=2)])

    (result,) = run(traced_fleet, scenario)
    assert result.status is EventStatus.SKIPPED
    finished = exporter.get_finished_spans()
    (span,) = [_received(s) for s in finished if s.name.startswith("toolfleet.call")]
    assert span.attributes["toolfleet.status"] == "skipped"
    assert span.status == "UNSET"
    assert "toolfleet.worker" not in span.attributes


def test_without_the_extra_tracing_is_a_no_op() -> None:
    # opentelemetry made unimportable, as on an install without toolfleet[otel].
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "from schemas import tracing\n"
        "assert not tracing.enabled()\n"
        "with tracing.span('x', {'a': 1}) as s:\n"
        "    assert s is None\n"
        "assert tracing.carrier() is None\n"
        "assert tracing.parent_of({'c': {'traceparent': 'x'}}, 'c') is None\n"
        "tracing.set_call_status(None, 'failed')\n"
        "assert not tracing.configure_from_env('w', {})\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_an_unknown_exporter_name_is_a_clear_error() -> None:
    from toolfleet.schemas.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"'jaeger'.*use 'otlp'"):
        configure_from_env("w", {"OTEL_TRACES_EXPORTER": "jaeger"})
    assert configure_from_env("w", {"OTEL_TRACES_EXPORTER": "none"}) is False
