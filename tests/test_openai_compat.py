"""Requests every OpenAI-compatible server accepts (`rubric_core.openai_compat`).

The shapes are pinned here against the scripted server; tests/test_real_python_server.py sends
the same revision to llama.cpp's Python server, which refused the list-of-parts shape.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from openai_server import FakeOpenAI, text

from rubric_core.models import resolve_model
from rubric_core.openai_compat import CompatibleChatOpenAI, compatible_message, compatible_payload


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param({"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                        {"type": "text", "text": "b"}]},
                     "ab", id="text_parts_are_joined"),
        pytest.param({"role": "assistant", "content": None,
                      "tool_calls": [{"id": "c", "type": "function",
                                      "function": {"name": "f", "arguments": "{}"}}]},
                     "", id="null_assistant_content_is_empty"),
        pytest.param({"role": "user", "content": []}, "", id="no_parts_is_empty"),
        pytest.param({"role": "user", "content": "plain"}, "plain", id="a_string_stays"),
    ],
)
def test_text_content_is_sent_as_a_string(message: dict[str, Any], expected: str) -> None:
    assert compatible_message(message)["content"] == expected


@pytest.mark.parametrize(
    "parts",
    [
        pytest.param([{"type": "text", "text": "see"},
                      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}],
                     id="image"),
        pytest.param([{"type": "text", "text": "stable", "cache_control": {"type": "ephemeral"}},
                      {"type": "text", "text": "attempt"}], id="cache_breakpoint"),
    ],
)
def test_parts_that_carry_something_stay_parts(parts: list[dict[str, Any]]) -> None:
    message = {"role": "user", "content": parts}
    assert compatible_message(message) == message


def test_max_completion_tokens_goes_as_max_tokens_except_to_openai() -> None:
    body = {"messages": [], "max_completion_tokens": 64}
    assert compatible_payload(body, host="127.0.0.1") == {"messages": [], "max_tokens": 64}
    assert compatible_payload(body, host="api.openai.com") == body


def test_a_revision_goes_out_as_strings_with_the_output_limit() -> None:
    """The worker's own streamed answer goes back in a revision: as a string, never parts."""
    with FakeOpenAI(default=text("revised")) as server:
        model = resolve_model("openai-compatible:m", base_url=server.base_url, max_tokens=32)
        assert isinstance(model, CompatibleChatOpenAI)
        earlier = AIMessage(content=[{"type": "text", "text": "first "},
                                     {"type": "text", "text": "draft"}])
        call = AIMessage(content="", tool_calls=[{"name": "t", "args": {}, "id": "c1"}])
        model.invoke([HumanMessage("write"), earlier, call, ToolMessage("ok", tool_call_id="c1"),
                      HumanMessage([{"type": "text", "text": "revise"}])])
        body = server.requests[-1]
    assert [m["content"] for m in body["messages"]] == ["write", "first draft", "", "ok",
                                                        "revise"]
    assert body["max_tokens"] == 32 and "max_completion_tokens" not in body
