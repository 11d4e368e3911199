"""A scripted OpenAI-compatible chat completions server for tests.

`FakeOpenAI` listens on 127.0.0.1 on a free port, in a background thread, and answers
``POST /v1/chat/completions`` the way the OpenAI API does, so that `langchain_openai.ChatOpenAI`
and the `openai` client talk to it unchanged. Replies are scripted, not generated:

    with FakeOpenAI() as server:
        server.enqueue(text("hello"), tool_call("search", {"q": "x"}), error(429, "slow down"))
        model = ChatOpenAI(base_url=server.base_url, api_key="test-key", model="fake-model")

Queued replies are served first in, first out. When the queue is empty, `server.default` answers:
either a fixed reply or a callable ``responder(body) -> reply`` that looks at the request (for
example, to answer as a grader whenever a tool named ``GraderResponse`` is offered). With neither,
the server answers 500 with a message saying nothing was scripted, rather than inventing a reply.

Both plain and ``stream: true`` requests are served; streams are server-sent events with
``stream_options.include_usage`` honoured. Usage counts are rough but deterministic: prompt tokens
are the characters of the request's message text divided by four.

Only the standard library is used, and the server never binds anything but the loopback address.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_PATH = "/v1/chat/completions"
"""The route the server answers; every other path gets a 404 JSON error (but `MODELS_PATH`)."""

MODELS_PATH = "/v1/models"
"""The model list, answered when `FakeOpenAI.models` is set."""

PROPS_PATH = "/props"
"""llama.cpp's server properties, answered when `FakeOpenAI.props` is set."""

_STREAM_PIECE_CHARS = 16
"""Characters of content (or tool arguments) per streamed delta."""


@dataclass(frozen=True)
class Text:
    """An assistant message with text content (finish_reason ``stop``)."""

    content: str
    """The message text."""
    finish_reason: str = "stop"
    """Why the reply ended: ``length`` for one cut at the request's output token limit."""


@dataclass(frozen=True)
class ToolCall:
    """An assistant message carrying one tool call (finish_reason ``tool_calls``)."""

    name: str
    """The function name."""
    args: dict[str, Any] | str
    """The function arguments; sent JSON-encoded as OpenAI does (a string: sent as it is,
    e.g. arguments cut short)."""
    call_id: str | None = None
    """The tool call id; a fresh ``call_...`` id when not given."""
    finish_reason: str = "tool_calls"
    """Why the reply ended: ``length`` for one cut at the request's output token limit."""


@dataclass(frozen=True)
class Error:
    """An HTTP error response with an OpenAI-shaped error body."""

    status: int
    """HTTP status code, e.g. 429, 500 or 503."""
    message: str
    """The error message the client will carry."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra response headers (429 gets ``Retry-After: 0`` by default)."""


@dataclass(frozen=True)
class Slow:
    """Another reply, sent only after a delay (to trip client timeouts)."""

    seconds: float
    """How long to wait before answering; cut short when the server stops."""
    reply: Reply
    """What to answer after the wait."""


@dataclass(frozen=True)
class Malformed:
    """A 200 response whose body is not JSON (or, when streaming, an event that is not)."""


@dataclass(frozen=True)
class Drop:
    """Close the connection without sending any response."""


Reply = Text | ToolCall | Error | Slow | Malformed | Drop
"""Anything `FakeOpenAI` can be scripted to answer with."""

_REPLY_TYPES = (Text, ToolCall, Error, Slow, Malformed, Drop)

Responder = Callable[[dict[str, Any]], Reply]
"""Computes a reply from the request body, for use as `FakeOpenAI.default`."""


def text(content: str, *, finish_reason: str = "stop") -> Text:
    """Script an assistant text reply (``finish_reason="length"``: one cut short)."""
    return Text(content, finish_reason)


def tool_call(name: str, args: dict[str, Any] | str, *, call_id: str | None = None,
              finish_reason: str = "tool_calls") -> ToolCall:
    """Script an assistant reply that calls tool ``name`` with ``args`` (a string: raw)."""
    return ToolCall(name, args if isinstance(args, str) else dict(args), call_id, finish_reason)


def verdict(
    result: str, failing: tuple[str, ...] = (), criteria: tuple[str, ...] = ("c1", "c2")
) -> ToolCall:
    """Script a ``GraderResponse`` call; criteria in `failing` fail with the gap ``fix <c>``."""
    answers = [
        {"name": c, "passed": c not in failing, **({"gap": f"fix {c}"} if c in failing else {})}
        for c in criteria
    ]
    return tool_call("GraderResponse", {"result": result, "explanation": f"{result}.",
                                        "criteria": answers})


def error(status: int, message: str, *, headers: dict[str, str] | None = None) -> Error:
    """Script an HTTP error; a 429 carries ``Retry-After: 0`` unless ``headers`` say otherwise."""
    extra = {"Retry-After": "0"} if status == 429 else {}
    return Error(status, message, {**extra, **(headers or {})})


def slow(seconds: float, reply: Reply) -> Slow:
    """Script ``reply`` to be sent after ``seconds``."""
    if seconds < 0:
        msg = f"seconds must be >= 0, got {seconds}"
        raise ValueError(msg)
    return Slow(seconds, reply)


def malformed() -> Malformed:
    """Script a 200 response whose body cannot be parsed."""
    return Malformed()


def drop() -> Drop:
    """Script a connection that closes without a response."""
    return Drop()


def _message_text(messages: object) -> str:
    """The text of request messages (content parts and tool-call arguments) for token counts."""
    if not isinstance(messages, list):
        return ""
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict):
                parts.append(str(call.get("function", {}).get("arguments", "")))
    return "".join(parts)


def _usage(body: dict[str, Any], completion: str) -> dict[str, int]:
    prompt_tokens = max(1, len(_message_text(body.get("messages"))) // 4)
    completion_tokens = max(1, len(completion) // 4)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _arguments(reply: ToolCall) -> str:
    return reply.args if isinstance(reply.args, str) else json.dumps(reply.args)


def _pieces(value: str) -> list[str]:
    return [value[i : i + _STREAM_PIECE_CHARS] for i in range(0, len(value), _STREAM_PIECE_CHARS)]


def _error_body(message: str, kind: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


class _Handler(BaseHTTPRequestHandler):
    """Serves one connection; the scripting lives on the `FakeOpenAI` that owns the server."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def do_GET(self) -> None:
        """``GET /v1/models`` lists `FakeOpenAI.models` when set; every other GET is unknown."""
        owner = self.server.owner
        if self.path.rstrip("/") == PROPS_PATH and owner.props is not None:
            self._send_json(200, owner.props)
            return
        if self.path.rstrip("/") == MODELS_PATH and owner.models is not None:
            owner.models_auth.append(self.headers.get("Authorization"))
            data = [{"id": m, "object": "model", "owned_by": "test"} for m in owner.models]
            self._send_json(200, {"object": "list", "data": data})
            return
        self._not_found()

    def do_POST(self) -> None:
        """Answer chat completions from the script; anything else is a 404."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path.split("?", 1)[0].rstrip("/") != CHAT_PATH:
            self._not_found()
            return
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            err = _error_body("request body is not a JSON object", "invalid_request_error", None)
            self._send_json(400, err)
            return
        owner = self.server.owner
        reply = owner._next_reply(body)
        try:
            self._answer(body, reply)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (timeout) while we were waiting or writing.
            self.close_connection = True

    def _answer(self, body: dict[str, Any], reply: Reply) -> None:
        owner = self.server.owner
        while isinstance(reply, Slow):
            if owner._stopping.wait(reply.seconds):
                self.close_connection = True
                return
            reply = reply.reply
        if isinstance(reply, Drop):
            self.close_connection = True
            return
        if isinstance(reply, Error):
            err = _error_body(reply.message, _ERROR_TYPES.get(reply.status, "server_error"), None)
            self._send_json(reply.status, err, reply.headers)
            return
        if body.get("stream"):
            self._stream(body, reply)
            return
        if isinstance(reply, Malformed):
            self._send_raw(200, b'{"id": "chatcmpl-broken", "choices": [', "application/json")
            return
        self._send_json(200, owner._completion(body, reply))

    def _stream(self, body: dict[str, Any], reply: Text | ToolCall | Malformed) -> None:
        owner = self.server.owner
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-request-id", f"req_{uuid.uuid4().hex}")
        self.end_headers()
        if isinstance(reply, Malformed):
            self._write_chunk(b"data: {this is not json\n\n")
        else:
            for event in owner._chunks(body, reply):
                self._write_chunk(f"data: {json.dumps(event)}\n\n".encode())
            self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _not_found(self) -> None:
        msg = f"Unknown request URL: {self.command} {self.path}. FakeOpenAI serves {CHAT_PATH}."
        self._send_json(404, _error_body(msg, "invalid_request_error", "unknown_url"))

    def _send_json(
        self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        self._send_raw(status, json.dumps(payload).encode(), "application/json", headers)

    def _send_raw(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", f"req_{uuid.uuid4().hex}")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Many clients connect at once in the concurrency benchmarks: socketserver's default
    # backlog of 5 resets the rest.
    request_queue_size = 256
    owner: FakeOpenAI

    def get_request(self) -> tuple[socket.socket, Any]:
        # Headers and body go out in separate writes; with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms a call), which is the server's cost, not the client's.
        sock, address = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout tests, a killed run) closes its socket mid-reply; that
        # is the scenario under test, not a server fault worth a traceback in the test output.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class FakeOpenAI:
    """An OpenAI-compatible chat completions server on 127.0.0.1, scripted by the test.

    The server starts on construction and stops on `stop()` or at the end of a ``with`` block.

    Attributes:
        base_url: What to pass as ``base_url`` to ChatOpenAI or the openai client.
        requests: The JSON bodies of every chat completions request received, in order.
        request_times: `time.monotonic()` at the arrival of each of those requests.
        default: The reply (or ``responder(body) -> reply``) used when the queue is empty.
    """

    def __init__(self, *, default: Reply | Responder | None = None) -> None:
        """Start serving on a free loopback port.

        Args:
            default: Initial value of `default`.
        """
        self.default: Reply | Responder | None = default
        self.models: list[str] | None = None
        """Model ids ``GET /v1/models`` lists; None: that route is a 404, as before."""
        self.models_auth: list[str | None] = []
        self.props: dict[str, Any] | None = None
        """What ``GET /props`` answers (as llama.cpp's ``llama-server`` does); None: a 404."""
        """The Authorization header of each ``GET /v1/models`` (None when absent)."""
        self.requests: list[dict[str, Any]] = []
        self.request_times: list[float] = []
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"FakeOpenAI:{port}",
            daemon=True,
        )
        self._thread.start()

    def __enter__(self) -> FakeOpenAI:
        """Return the running server."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop the server."""
        self.stop()

    def enqueue(self, *replies: Reply) -> None:
        """Append replies to the script, served one per request in order."""
        for reply in replies:
            if not isinstance(reply, _REPLY_TYPES):
                msg = f"not a scripted reply: {reply!r}; use text(), tool_call(), error(), ..."
                raise TypeError(msg)
        with self._lock:
            self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """How many queued replies have not been served yet."""
        with self._lock:
            return len(self._queue)

    def stop(self) -> None:
        """Stop serving, wake any delayed replies and close the listening socket. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.request_times.append(time.monotonic())
            if self._queue:
                return self._queue.popleft()
            default = self.default
        if default is None:
            return Error(500, "FakeOpenAI: no reply queued and no default set")
        if not callable(default):
            return default
        try:
            reply = default(body)
        except Exception as exc:
            # Surface a broken responder to the test as an error it can read, not a hang.
            return Error(500, f"FakeOpenAI: responder raised {type(exc).__name__}: {exc}")
        if not isinstance(reply, _REPLY_TYPES):
            return Error(500, f"FakeOpenAI: responder returned {reply!r}, not a scripted reply")
        return reply

    def _envelope(self, body: dict[str, Any], kind: str, completion_id: str) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": kind,
            "created": int(time.time()),
            "model": body.get("model", "fake-model"),
            "system_fingerprint": "fp_fakeopenai",
            "service_tier": "default",
        }

    def _new_id(self) -> str:
        return f"chatcmpl-fake{next(self._ids):06d}{uuid.uuid4().hex[:12]}"

    def _call_id(self, reply: ToolCall) -> str:
        return reply.call_id or f"call_{uuid.uuid4().hex[:24]}"

    def _completion(self, body: dict[str, Any], reply: Text | ToolCall) -> dict[str, Any]:
        """A non-streamed ``chat.completion`` object for ``reply``."""
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        if isinstance(reply, Text):
            message["content"] = reply.content
            finish, produced = reply.finish_reason, reply.content
        else:
            arguments = _arguments(reply)
            message["tool_calls"] = [
                {
                    "id": self._call_id(reply),
                    "type": "function",
                    "function": {"name": reply.name, "arguments": arguments},
                }
            ]
            finish, produced = reply.finish_reason, reply.name + arguments
        return {
            **self._envelope(body, "chat.completion", self._new_id()),
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": _usage(body, produced),
        }

    def _chunks(self, body: dict[str, Any], reply: Text | ToolCall) -> list[dict[str, Any]]:
        """The ``chat.completion.chunk`` events of a streamed ``reply``."""
        options = body.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        envelope = self._envelope(body, "chat.completion.chunk", self._new_id())
        if include_usage:
            envelope["usage"] = None

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**envelope, "choices": [choice]}

        if isinstance(reply, Text):
            events = [chunk({"role": "assistant", "content": "", "refusal": None})]
            events += [chunk({"content": piece}) for piece in _pieces(reply.content)]
            events.append(chunk({}, reply.finish_reason))
            produced = reply.content
        else:
            arguments = _arguments(reply)
            head = {
                "index": 0,
                "id": self._call_id(reply),
                "type": "function",
                "function": {"name": reply.name, "arguments": ""},
            }
            events = [chunk({"role": "assistant", "content": None, "tool_calls": [head]})]
            events += [
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                for piece in _pieces(arguments)
            ]
            events.append(chunk({}, reply.finish_reason))
            produced = reply.name + arguments
        if include_usage:
            events.append({**envelope, "choices": [], "usage": _usage(body, produced)})
        return events


__all__ = [
    "CHAT_PATH",
    "Drop",
    "Error",
    "FakeOpenAI",
    "Malformed",
    "Reply",
    "Responder",
    "Slow",
    "Text",
    "ToolCall",
    "drop",
    "error",
    "malformed",
    "slow",
    "text",
    "tool_call",
]


class DelayedServer:
    """A `FakeOpenAI` that answers as worker and grader after a fixed delay per call.

    It counts the requests in flight (``peak`` is the most at once) and records when each
    response was ready (``done``), for concurrency tests and ``bench/experiment.py``. The
    worker's k-th answer of a row is ``answer k``; the grader fails an answer before the
    ``passes``-th (criterion ``answers the question``) and then gives ``grader_reply`` (set it
    to script an error), so each row takes ``passes`` worker and ``passes`` grader calls.

    Args:
        delay_s: Seconds each call takes.
        grader_reply: What a request carrying the GraderResponse tool is answered with, from
            the ``passes``-th answer on.
        passes: Grading passes per row.
    """

    def __init__(self, delay_s: float, grader_reply: Reply | None = None, *,
                 passes: int = 1) -> None:
        self.delay_s, self.in_flight, self.peak = delay_s, 0, 0
        self.grader_reply: Reply = grader_reply or verdict("satisfied")
        self.passes = passes
        self.done: list[float] = []
        self._lock = threading.Lock()
        self.fake = FakeOpenAI(default=self.respond)

    def respond(self, body: dict[str, Any]) -> Reply:
        """Wait the delay, then answer as the grader or the worker."""
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            time.sleep(self.delay_s)
        finally:
            with self._lock:
                self.in_flight -= 1
                self.done.append(time.monotonic())
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        if "GraderResponse" not in names:
            # Answer k of a row: one user message (the prompt), then one per revision request.
            k = sum(m.get("role") == "user" for m in body.get("messages") or [])
            return text(f"answer {k}")
        seen = [int(n) for n in re.findall(r"answer (\d+)", json.dumps(body["messages"]))]
        if max(seen, default=self.passes) < self.passes:
            return verdict("needs_revision", ("answers the question",), ("answers the question",))
        return self.grader_reply


class CachingOpenAI(FakeOpenAI):
    """A `FakeOpenAI` that reports prompt caching the way OpenAI does.

    Every reply's usage carries ``prompt_tokens_details.cached_tokens``: the start this
    request's message text shares with the most similar earlier request's (the last 64 kept),
    counted in the server's 4-character tokens, and reported only when it is at least
    ``min_cached_tokens`` (OpenAI caches from 1,024 tokens on; 0 below that). Streamed replies
    carry it on their usage chunk (``stream_options.include_usage``).

    Attributes:
        cached: The cached tokens reported for each answered request, in order.
    """

    def __init__(self, *, min_cached_tokens: int = 256, **kwargs: Any) -> None:
        self.min_cached_tokens = min_cached_tokens
        self.cached: list[int] = []
        self._prompts: deque[str] = deque(maxlen=64)
        self._cache_lock = threading.Lock()
        super().__init__(**kwargs)

    def _cached_tokens(self, body: dict[str, Any]) -> int:
        prompt = _message_text(body.get("messages"))
        with self._cache_lock:
            shared = max((_shared_start(prompt, p) for p in self._prompts), default=0)
            self._prompts.append(prompt)
            tokens = shared // 4 if shared // 4 >= self.min_cached_tokens else 0
            self.cached.append(tokens)
        return tokens

    def _completion(self, body: dict[str, Any], reply: Text | ToolCall) -> dict[str, Any]:
        completion = super()._completion(body, reply)
        completion["usage"]["prompt_tokens_details"] = {"cached_tokens": self._cached_tokens(body)}
        return completion

    def _chunks(self, body: dict[str, Any], reply: Text | ToolCall) -> list[dict[str, Any]]:
        events = super()._chunks(body, reply)
        cached = self._cached_tokens(body)
        if events and events[-1].get("usage"):
            events[-1]["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
        return events


def _shared_start(a: str, b: str) -> int:
    """How many leading characters two texts share (a binary search over slice compares)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low
