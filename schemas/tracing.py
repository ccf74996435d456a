"""OpenTelemetry spans across the broker, when the optional extra ``toolfleet[otel]`` is there.

Without the ``opentelemetry`` packages every function here is a no-op that allocates nothing
beyond a ``nullcontext``, so toolfleet pays nothing for tracing it was not asked for. With them,
spans go to whatever TracerProvider the process set up (none: the API's no-op tracer).

The trace context of each call crosses the broker in the Celery message headers, under
:data:`TRACE_HEADER`: a map from the call's Celery task id to a W3C ``traceparent`` carrier,
plus ``sent_ns`` (when it was published), so one message holding several calls (opt-in
batching) still gives each call its own parent. Argument values are never span attributes:
only the names and ids below are, so a secret argument cannot leak into a trace.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

from toolfleet.schemas.error_info import ErrorInfo
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.schemas.status import EventStatus
from toolfleet.schemas.wire import CallMessage, CallResult

try:  # the optional extra; absent, every function below is a no-op
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, StatusCode
except ImportError:  # pragma: no cover - exercised by a subprocess test without the extra
    trace = None  # type: ignore[assignment]

__all__ = [
    "ATTR_ATTEMPT",
    "ATTR_BRANCH_ID",
    "ATTR_CALL_ID",
    "ATTR_FUNCTION",
    "ATTR_STATUS",
    "ATTR_TOOL_CALL_ID",
    "ATTR_WORKER",
    "TRACER_NAME",
    "TRACE_HEADER",
    "carrier",
    "child_span",
    "configure_from_env",
    "enabled",
    "flush",
    "parent_of",
    "record_error",
    "sent_ns",
    "set_call_status",
    "set_result_status",
    "span",
    "trace_headers",
    "worker_span",
]

TRACER_NAME = "toolfleet"
TRACE_HEADER = "toolfleet_trace"

ATTR_FUNCTION = "toolfleet.function"
ATTR_CALL_ID = "toolfleet.call_id"
ATTR_TOOL_CALL_ID = "toolfleet.tool_call_id"
ATTR_STATUS = "toolfleet.status"
ATTR_WORKER = "toolfleet.worker"
ATTR_ATTEMPT = "toolfleet.attempt"
ATTR_BRANCH_ID = "toolfleet.branch_id"

# Statuses that mark a span ERROR; SKIPPED (a denied call) and COMPLETED do not.
_ERROR_STATUSES = frozenset({EventStatus.FAILED, EventStatus.ABORTED, EventStatus.CANCELLED})
_KINDS = ("internal", "producer", "consumer", "server")
_OTLP = "otlp"
_CONSOLE = "console"


def enabled() -> bool:
    """True when the OpenTelemetry API is importable (the ``toolfleet[otel]`` extra)."""
    return trace is not None


@contextlib.contextmanager
def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: str = "internal",
    parent: Mapping[str, str] | None = None,
    start_ns: int | None = None,
) -> Iterator[Any]:
    """Open a span (the current one while inside); yields it, or None without the extra.

    ``parent``: a carrier from :func:`carrier` to continue a trace from another process.
    An exception leaving the block marks the span ERROR with the exception's type.
    """
    if trace is None or (not parent and _no_provider()):
        # Nothing would record it, and the no-op span would only re-expose the current
        # context, which stays current anyway (~15 % of a batched echo's dispatcher
        # time went to no-op spans).
        yield None
        return
    tracer = trace.get_tracer(TRACER_NAME)
    context = propagate.extract(dict(parent)) if parent else None
    attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
    with tracer.start_as_current_span(
        name,
        context=context,
        kind=_kind(kind),
        attributes=attrs,
        start_time=start_ns,
        record_exception=False,  # an exception's text may quote an argument value
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_status(StatusCode.ERROR, type(exc).__name__)
            raise


# The OpenTelemetry API loads a provider named by this variable on first use; checking it
# costs an os.environ miss (a KeyError inside) per call, so it is read once, at import.
_PROVIDER_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
_UNKNOWN = object()


def _no_provider() -> bool:
    """True while no TracerProvider is installed (the API's proxy, or its explicit no-op):
    every span would be a non-recording one."""
    assert trace is not None
    # Fast path (twice per call on each side): the API's own global, still unset.
    if getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not _PROVIDER_ENV:
        return True
    return isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def child_span(name: str, parent_span: Any, start_ns: int, end_ns: int) -> None:
    """Record an already finished interval (e.g. a queue wait) as a child of ``parent_span``."""
    if trace is None or parent_span is None or not parent_span.is_recording():
        return
    tracer = trace.get_tracer(TRACER_NAME)
    context = trace.set_span_in_context(parent_span)
    child = tracer.start_span(name, context=context, start_time=start_ns)
    child.end(end_time=max(start_ns, end_ns))


@contextlib.contextmanager
def worker_span(message: CallMessage, worker: str, header: Any) -> Iterator[Any]:
    """The worker's span of one call, a child of the dispatcher's call span found in the
    message's :data:`TRACE_HEADER` value ``header``; its first child is the queue wait."""
    parent = parent_of(header, message.call_id)
    with span(
        f"toolfleet.worker {message.function}",
        {
            ATTR_FUNCTION: message.function,
            ATTR_CALL_ID: message.call_id,
            ATTR_TOOL_CALL_ID: message.tool_call_id,
            ATTR_ATTEMPT: message.attempt,
            ATTR_WORKER: worker,
        },
        kind="consumer",
        parent=parent,
    ) as current:
        published_ns = sent_ns(parent)
        if published_ns is not None:
            child_span("toolfleet.queue_wait", current, published_ns, time.time_ns())
        yield current


def set_result_status(current: Any, result: CallResult) -> None:
    """:func:`set_call_status` from a call's terminal record."""
    info = ErrorInfo.from_record(result.execution.get("error"))
    set_call_status(current, result.status, error_type=None if info is None else info.type)


def set_call_status(
    current: Any,
    status: EventStatus | str | None,
    *,
    error_type: str | None = None,
    **attributes: Any,
) -> None:
    """Set a call span's toolfleet status (and its OpenTelemetry status) and attributes.

    Keyword names map to the ``toolfleet.*`` attributes (``function``, ``call_id``,
    ``tool_call_id``, ``worker``, ``attempt``, ``branch_id``); None values are left out.
    ``error_type`` (ErrorInfo.type) is the ERROR status's description.
    """
    if current is None or not current.is_recording():
        return
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(f"toolfleet.{key}", value)
    if status is None:
        return
    status = EventStatus(status)
    current.set_attribute(ATTR_STATUS, status.value)
    if status in _ERROR_STATUSES:
        # The error type only: its message can quote argument values.
        current.set_status(StatusCode.ERROR, error_type or status.value)
    elif status is EventStatus.COMPLETED:
        current.set_status(StatusCode.OK)


def record_error(current: Any, error: BaseException | None, *, message: bool = True) -> None:
    """Mark ``current`` ERROR for ``error`` (what a tool raised), recorded as the span's
    ``exception`` event: type, message and stack trace, as OpenTelemetry's
    ``record_exception`` does. ``message=False`` (a tool with secret arguments, whose text
    may quote one) records the type and the stack's frames only. No ``error``: no change."""
    if error is None or current is None or not current.is_recording():
        return
    kind = type(error)
    name = kind.__qualname__
    module = kind.__module__
    qualified = f"{module}.{name}" if module and module != "builtins" else name
    if message:
        stack = "".join(traceback.format_exception(error))
    else:
        stack = "".join(traceback.format_tb(error.__traceback__)) + qualified + "\n"
    text = str(error)
    attributes = {"exception.type": qualified, "exception.stacktrace": stack}
    if message:
        attributes["exception.message"] = text
    current.add_event("exception", attributes)
    current.set_status(StatusCode.ERROR, name)


def carrier() -> dict[str, str] | None:
    """The current trace context as a W3C carrier for a message header, or None."""
    if trace is None:
        return None
    out: dict[str, str] = {}
    propagate.inject(out)
    if not out:
        return None  # no recording span here: send nothing
    out["sent_ns"] = str(time.time_ns())
    return out


def trace_headers(messages: Iterable[CallMessage]) -> dict[str, Any]:
    """Celery message headers carrying each call's trace context; empty when none has one."""
    carriers = {m.call_id: m._trace for m in messages if m._trace}
    return {TRACE_HEADER: carriers} if carriers else {}


def parent_of(header: Any, call_id: str) -> dict[str, str] | None:
    """The carrier for ``call_id`` in a received :data:`TRACE_HEADER` value, if any."""
    if trace is None or not isinstance(header, Mapping):
        return None
    found = header.get(call_id)
    if not isinstance(found, Mapping):
        return None
    return {str(k): str(v) for k, v in found.items()}


def sent_ns(parent: Mapping[str, str] | None) -> int | None:
    """When the call was published (a carrier's ``sent_ns``), or None."""
    try:
        return int(parent["sent_ns"]) if parent else None
    except (KeyError, ValueError):
        return None


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans still buffered in this process (before it exits)."""
    if trace is None:
        return
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(int(timeout_s * 1000))


def configure_from_env(
    service_name: str, env: Mapping[str, str] | None = None, *, console: IO[str] | None = None
) -> bool:
    """Install an exporting TracerProvider from the standard ``OTEL_*`` variables.

    Only when ``OTEL_TRACES_EXPORTER`` names ``otlp`` (OTLP over HTTP, to
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and/or
    ``console``, and no provider was installed yet (one set up by the process, e.g. by
    ``opentelemetry-instrument``, is kept). Returns True when it installed one.
    ``console``: where the console exporter writes (default stdout; a stdio MCP server's
    stdout is its protocol stream, so it passes stderr).
    """
    env = os.environ if env is None else env
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names or names == ["none"]:
        return False
    unknown = [n for n in names if n not in (_OTLP, _CONSOLE)]
    if unknown:
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER={env['OTEL_TRACES_EXPORTER']!r} names {unknown}, which "
            f"toolfleet cannot set up; use 'otlp' (OTLP over HTTP), 'console' or 'none'"
        )
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        if _OTLP in names:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER={env['OTEL_TRACES_EXPORTER']!r} asks for traces, but "
            f"{exc.name} is not installed; pip install 'toolfleet[otel]' or unset it"
        ) from None
    assert trace is not None  # the SDK imports the API
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in names:
        exporter: Any = (
            OTLPSpanExporter() if name == _OTLP else ConsoleSpanExporter(out=console or sys.stdout)
        )
        # Batched export keeps the tool's path free of network calls; the processor
        # re-creates its thread in a forked prefork child.
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


def _kind(name: str) -> Any:
    if name not in _KINDS:
        raise ConfigurationError(f"span kind {name!r} is not one of {list(_KINDS)}")
    return getattr(SpanKind, name.upper())
