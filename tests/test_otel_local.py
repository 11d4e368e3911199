"""OpenTelemetry export of a run's traces to a local OTLP/HTTP collector: what it receives.

LangChain's tracer (`langsmith`, with the ``otel`` extra: `opentelemetry-sdk` and the OTLP/HTTP
exporter) sends the graph's runs as OpenTelemetry spans when ``LANGSMITH_TRACING=true`` and
``LANGSMITH_TRACING_MODE=otel``, to ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``. A tiny
collector on 127.0.0.1 decodes each ``ExportTraceServiceRequest`` (protobuf) it is sent. The run
is a real CLI process on the offline models, so the exporter's flush at exit is tested too.
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from trace_collector import SECRET, serving, traced_run

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator



class _Collector(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.paths: list[str] = []
        self.spans: list[Any] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Collector

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(min(length, 16_000_000)) if length else b""
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.server.lock:
            self.server.paths.append(self.path)
            self.server.spans += [span for rs in request.resource_spans
                                  for ss in rs.scope_spans for span in ss.spans]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def collector() -> Iterator[_Collector]:
    with serving(_Collector()) as server:
        yield server


def _traced_run(collector: _Collector, **env: str) -> subprocess.CompletedProcess[str]:
    return traced_run(LANGSMITH_TRACING_MODE="otel",
                      OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, **env)


def _text(span: Any) -> str:
    return " ".join(str(a.value.string_value) for a in span.attributes)


def test_a_runs_spans_reach_a_local_otlp_collector_as_one_trace(collector: _Collector) -> None:
    proc = _traced_run(collector)
    assert proc.returncode == 0, proc.stderr
    assert set(collector.paths) == {"/v1/traces"}
    names = [span.name for span in collector.spans]
    # The graph, each grading pass and both chat models' calls, one span each per pass.
    assert "LangGraph" in names
    assert names.count("rubric_grader") == names.count("RulesGrader") >= 1
    assert names.count("DemoWorker") >= names.count("rubric_grader")
    assert len({span.trace_id for span in collector.spans}) == 1  # one run, one trace
    by_id = {span.span_id: span for span in collector.spans}
    [root] = [s for s in collector.spans if not s.parent_span_id]
    assert root.name == "LangGraph"
    for span in collector.spans:  # every span hangs from the graph's
        while span.parent_span_id:
            span = by_id[span.parent_span_id]
        assert span is root
    grader = next(s for s in collector.spans if s.name == "RulesGrader")
    attributes = {a.key: a.value for a in grader.attributes}
    assert attributes["langsmith.span.kind"].string_value == "llm"
    assert "GraderResponse" in _text(grader)  # the verdict's tool call, as sent back
    # Not ours: LangChain's tracer does not scrub secrets from what it exports.
    assert any(SECRET in _text(span) for span in collector.spans)


def test_hiding_inputs_and_outputs_keeps_the_secret_from_the_collector(
        collector: _Collector) -> None:
    proc = _traced_run(collector, LANGSMITH_HIDE_INPUTS="true", LANGSMITH_HIDE_OUTPUTS="true")
    assert proc.returncode == 0, proc.stderr
    assert "rubric_grader" in [span.name for span in collector.spans]  # the spans still go
    assert not any(SECRET in _text(span) for span in collector.spans)
