"""LangSmith tracing pointed at a local endpoint (``LANGSMITH_ENDPOINT``): what it receives.

LangChain's own tracer (`langsmith`) is not ours: `LANGSMITH_TRACING=true` turns it on, and it
sends every run of the graph (chains, the grading pass, each chat model call) to the endpoint.
A tiny collector on 127.0.0.1 stands in for LangSmith: it answers ``GET /info`` and keeps the
bodies of ``POST /runs/multipart`` (at most 8 MB; it stops when the test ends, or after 120 s
by itself). The run is a real CLI process, so the tracer's environment is read fresh and its
flush at exit is part of what is tested.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest
from trace_collector import SECRET, serving, traced_run

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator

_KEEP_BYTES = 8_000_000


class _Collector(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.kept = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def body(self) -> bytes:
        with self.lock:
            return b"".join(r[3] for r in self.requests)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Collector

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with self.server.lock:
            room = max(0, _KEEP_BYTES - self.server.kept)
            self.server.kept += min(room, len(body))
            self.server.requests.append((self.command, self.path, dict(self.headers),
                                         body[:room]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PATCH = _answer


@pytest.fixture
def collector() -> Iterator[_Collector]:
    with serving(_Collector()) as server:
        yield server


def _traced_run(collector: _Collector, **env: str) -> subprocess.CompletedProcess[str]:
    return traced_run(LANGSMITH_ENDPOINT=collector.url,
                      LANGSMITH_API_KEY="lsv2_test_local_key", **env)


def test_langsmith_tracer_sends_a_runs_traces_to_a_local_endpoint(collector: _Collector) -> None:
    proc = _traced_run(collector)
    assert proc.returncode == 0, proc.stderr
    paths = [(method, path) for method, path, _, _ in collector.requests]
    assert ("GET", "/info") in paths and ("POST", "/runs/multipart") in paths
    assert {headers.get("x-api-key") for _, _, headers, _ in collector.requests} == {
        "lsv2_test_local_key"}
    body = collector.body()
    # The grading pass and both chat models' calls are among the runs sent.
    assert b"rubric_grader" in body and b"demo-worker" in body and b"rules-grader" in body
    # Not ours: LangSmith's tracer does not scrub secrets from what it sends.
    assert SECRET.encode() in body


def test_hiding_inputs_and_outputs_keeps_the_secret_from_the_endpoint(
        collector: _Collector) -> None:
    proc = _traced_run(collector, LANGSMITH_HIDE_INPUTS="true", LANGSMITH_HIDE_OUTPUTS="true")
    assert proc.returncode == 0, proc.stderr
    body = collector.body()
    assert b"rubric_grader" in body  # the runs still go, without their inputs and outputs
    assert SECRET.encode() not in body
