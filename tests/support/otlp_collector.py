"""A tiny OTLP/HTTP trace collector for tests: worker processes export their spans to it.

It decodes ``POST /v1/traces`` (protobuf, optionally gzip) with the ``opentelemetry-proto``
messages the OTLP exporter itself uses, and keeps each span as a :class:`ReceivedSpan`.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["OtlpCollector", "ReceivedSpan"]

# opentelemetry-proto's Status.StatusCode values.
STATUS_NAMES = {0: "UNSET", 1: "OK", 2: "ERROR"}


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    status: str
    attributes: dict[str, Any] = field(default_factory=dict)
    service: str = ""
    start_ns: int = 0
    end_ns: int = 0
    # (name, attributes) of each span event, e.g. ("exception", {"exception.type": ...}).
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # The status's description: an ERROR span's error type (ErrorInfo.type).
    description: str = ""


class OtlpCollector:
    """``with OtlpCollector() as collector:`` listens on 127.0.0.1 at ``collector.endpoint``."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector._add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the test output is for failures

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The traces URL, for OTEL_EXPORTER_OTLP_TRACES_ENDPOINT."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"

    def worker_env(self) -> dict[str, str]:
        """The ``OTEL_*`` environment that makes a worker export its spans here."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: spans reach the collector quickly
        }

    def __enter__(self) -> OtlpCollector:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def spans_where(
        self, predicate: Callable[[list[ReceivedSpan]], bool]
    ) -> list[ReceivedSpan] | None:
        """The spans received so far if ``predicate(spans)`` holds, else None: a condition
        for ``until``."""
        spans = self.snapshot()
        return spans if predicate(spans) else None

    def names(self) -> str:
        """The names of the spans received so far, for an error."""
        return f"spans received: {sorted(s.name for s in self.snapshot())}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex() or None,
                            status=STATUS_NAMES.get(s.status.code, str(s.status.code)),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            service=str(resource.get("service.name", "")),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            events=[
                                (e.name, {a.key: _value(a.value) for a in e.attributes})
                                for e in s.events
                            ],
                        )
                    )
        with self._lock:
            self.spans.extend(received)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None
