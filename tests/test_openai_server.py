"""The fake OpenAI server speaks the wire format that langchain-openai and openai expect."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import openai
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai_server import (
    FakeOpenAI,
    drop,
    error,
    malformed,
    slow,
    text,
    tool_call,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from openai_server import Reply

pytestmark = pytest.mark.timeout(30)

_INVOKE_OR_STREAM = [pytest.param(False, id="invoke"), pytest.param(True, id="stream")]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    """A fresh server per test, stopped afterwards."""
    with FakeOpenAI() as fake:
        yield fake


def _model(server: FakeOpenAI, *, timeout: float = 2) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=server.base_url,
        api_key="test-key",
        model="fake-model",
        max_retries=0,
        timeout=timeout,
    )


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_base_url_is_loopback_v1(server: FakeOpenAI) -> None:
    assert server.base_url.startswith("http://127.0.0.1:")
    assert server.base_url.endswith("/v1")


def test_plain_text_invoke(server: FakeOpenAI) -> None:
    prompt = "x" * 400
    server.enqueue(text("Hello from the fake."))

    reply = _model(server).invoke([HumanMessage(prompt)])

    assert reply.content == "Hello from the fake."
    assert reply.response_metadata["model_name"] == "fake-model"
    assert reply.response_metadata["finish_reason"] == "stop"
    assert reply.response_metadata["id"].startswith("chatcmpl-")
    assert reply.usage_metadata is not None
    assert reply.usage_metadata["input_tokens"] == len(prompt) // 4
    assert reply.usage_metadata["total_tokens"] == (
        reply.usage_metadata["input_tokens"] + reply.usage_metadata["output_tokens"]
    )


def test_async_invoke(server: FakeOpenAI) -> None:
    server.enqueue(text("async ok"))

    reply = asyncio.run(_model(server).ainvoke("hi"))

    assert reply.content == "async ok"


@pytest.mark.parametrize(
    ("include_usage", "expect_usage"),
    [
        pytest.param(True, True, id="include_usage_sends_usage_chunk"),
        pytest.param(False, False, id="no_usage_chunk_unless_asked"),
    ],
)
def test_streaming_text(server: FakeOpenAI, include_usage: bool, expect_usage: bool) -> None:
    content = "A streamed answer that is long enough to arrive in several deltas."
    server.enqueue(text(content))

    chunks = list(_model(server).stream("hi", stream_usage=include_usage))

    assert len([c for c in chunks if c.content]) > 1
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert isinstance(merged, AIMessageChunk)
    assert merged.content == content
    assert merged.response_metadata["finish_reason"] == "stop"
    assert (merged.usage_metadata is not None) is expect_usage
    body = server.requests[-1]
    assert body["stream"] is True
    assert bool((body.get("stream_options") or {}).get("include_usage")) is include_usage


@pytest.mark.parametrize("stream", _INVOKE_OR_STREAM)
def test_bind_tools_tool_call_is_parsed(server: FakeOpenAI, stream: bool) -> None:
    server.enqueue(tool_call("add", {"a": 2, "b": 40}, call_id="call_fixed"))
    bound = _model(server).bind_tools([add])

    if stream:
        merged: Any = None
        for chunk in bound.stream("what is 2 + 40?"):
            merged = chunk if merged is None else merged + chunk
        reply = merged
    else:
        reply = bound.invoke("what is 2 + 40?")

    assert reply.tool_calls == [
        {"name": "add", "args": {"a": 2, "b": 40}, "id": "call_fixed", "type": "tool_call"}
    ]
    assert reply.response_metadata["finish_reason"] == "tool_calls"
    assert [t["function"]["name"] for t in server.requests[-1]["tools"]] == ["add"]


@pytest.mark.parametrize(
    ("reply", "exc_type"),
    [
        pytest.param(error(429, "slow down"), openai.RateLimitError, id="429_rate_limit"),
        pytest.param(error(500, "boom"), openai.InternalServerError, id="500_internal"),
        pytest.param(error(503, "overloaded"), openai.InternalServerError, id="503_unavailable"),
        pytest.param(drop(), openai.APIConnectionError, id="dropped_connection"),
    ],
)
def test_errors_raise_openai_exceptions(
    server: FakeOpenAI, reply: Reply, exc_type: type[Exception]
) -> None:
    server.enqueue(reply)

    with pytest.raises(exc_type):
        _model(server).invoke("hi")


def test_rate_limit_carries_retry_after_zero(server: FakeOpenAI) -> None:
    server.enqueue(error(429, "slow down"))

    with pytest.raises(openai.RateLimitError) as info:
        _model(server).invoke("hi")

    assert info.value.response.headers["retry-after"] == "0"
    assert "slow down" in str(info.value)


def test_slow_reply_beyond_timeout_raises_and_server_recovers(server: FakeOpenAI) -> None:
    server.enqueue(slow(5, text("too late")), text("on time"))
    model = _model(server, timeout=0.3)

    started = time.perf_counter()
    with pytest.raises(openai.APITimeoutError):
        model.invoke("hi")
    assert time.perf_counter() - started < 2

    assert model.invoke("again").content == "on time"


def test_slow_reply_within_timeout_arrives(server: FakeOpenAI) -> None:
    server.enqueue(slow(0.05, text("a bit later")))

    assert _model(server).invoke("hi").content == "a bit later"


@pytest.mark.parametrize("stream", _INVOKE_OR_STREAM)
def test_malformed_body_raises(server: FakeOpenAI, stream: bool) -> None:
    server.enqueue(malformed())
    model = _model(server)

    with pytest.raises(ValueError, match="line 1"):
        if stream:
            list(model.stream("hi"))
        else:
            model.invoke("hi")


def test_default_responder_scripts_a_grader(server: FakeOpenAI) -> None:
    def responder(body: dict[str, Any]) -> Reply:
        names = [t["function"]["name"] for t in body.get("tools", [])]
        if "GraderResponse" in names:
            return tool_call("GraderResponse", {"result": "satisfied", "explanation": "ok"})
        return text("a draft")

    server.default = responder
    model = _model(server)

    assert model.invoke("write").content == "a draft"
    graded = model.bind_tools(
        [{"type": "function", "function": {"name": "GraderResponse", "parameters": {}}}],
        tool_choice="GraderResponse",
    ).invoke("grade")
    assert graded.tool_calls[0]["name"] == "GraderResponse"
    assert graded.tool_calls[0]["args"]["result"] == "satisfied"


def test_queue_comes_before_default(server: FakeOpenAI) -> None:
    server.default = text("default")
    server.enqueue(text("queued"))
    model = _model(server)

    assert [model.invoke("hi").content for _ in range(3)] == ["queued", "default", "default"]
    assert server.pending == 0


def test_unscripted_request_is_an_explicit_500(server: FakeOpenAI) -> None:
    with pytest.raises(openai.InternalServerError, match="no reply queued"):
        _model(server).invoke("hi")


@pytest.mark.parametrize(
    ("responder", "match"),
    [
        pytest.param(lambda body: 1 / 0, "responder raised ZeroDivisionError", id="raises"),
        pytest.param(lambda body: "plain", "not a scripted reply", id="returns_non_reply"),
    ],
)
def test_broken_responder_is_an_explicit_500(
    server: FakeOpenAI, responder: Any, match: str
) -> None:
    server.default = responder

    with pytest.raises(openai.InternalServerError, match=match):
        _model(server).invoke("hi")


def test_records_request_bodies(server: FakeOpenAI) -> None:
    server.enqueue(text("one"), text("two"))
    model = _model(server)

    model.invoke("first")
    model.invoke([HumanMessage("second")], temperature=0.5)

    assert [b["messages"][-1]["content"] for b in server.requests] == ["first", "second"]
    assert all(b["model"] == "fake-model" for b in server.requests)
    assert server.requests[1]["temperature"] == 0.5


def test_unknown_path_is_json_404(server: FakeOpenAI) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{server.base_url}/models", timeout=2)

    assert info.value.code == 404
    assert "error" in json.loads(info.value.read())
    assert server.requests == []


def test_enqueue_rejects_non_replies(server: FakeOpenAI) -> None:
    with pytest.raises(TypeError, match="not a scripted reply"):
        server.enqueue("plain string")  # type: ignore[arg-type]


def test_stop_is_prompt_with_a_delayed_reply_pending() -> None:
    fake = FakeOpenAI()
    fake.enqueue(slow(30, text("never")))
    with pytest.raises(openai.APITimeoutError):
        _model(fake, timeout=0.2).invoke("hi")

    started = time.perf_counter()
    fake.stop()
    fake.stop()

    assert time.perf_counter() - started < 2
