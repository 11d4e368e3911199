"""Chat Completions requests that every OpenAI-compatible server accepts, in one place.

OpenAI's own API takes message content as a string or as a list of parts, and an assistant
message with tool calls may have ``null`` content. Servers that follow the schema more
strictly refuse the rest: llama.cpp's Python server (``llama_cpp.server`` 0.3.36) answers HTTP
500 "Input should be a valid string" to an assistant message whose content is a list of text
parts (what LangChain sends back for a streamed answer) or ``null``, and ignores
``max_completion_tokens``. `CompatibleChatOpenAI` is the chat model of every
``openai-compatible:`` (and ``openai:`` with a base URL) model string (`rubric_core.models`), so
the worker, the grader, the refiner and the lab all send through `compatible_payload`:

- content made only of text parts becomes the joined string; content with any other part (an
  image, a part carrying Anthropic's ``cache_control`` for a gateway) stays a list;
- an assistant message's ``null`` content becomes ``""``;
- ``max_completion_tokens`` (what langchain-openai sends for ``max_tokens``) is sent as
  ``max_tokens``, which OpenAI-compatible servers read, except to api.openai.com itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_openai import ChatOpenAI
from typing_extensions import override

from rubric_core.endpoint import OPENAI_HOSTS, model_host

if TYPE_CHECKING:
    from langchain_core.language_models import LanguageModelInput


def _text_only(parts: list[Any]) -> bool:
    """Whether content parts carry nothing but text (no image, no cache breakpoint)."""
    return all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
               and "cache_control" not in p for p in parts)


def compatible_message(message: dict[str, Any]) -> dict[str, Any]:
    """One Chat Completions message as every OpenAI-compatible server takes it (see above)."""
    content = message.get("content")
    if isinstance(content, list) and _text_only(content):
        return {**message, "content": "".join(p["text"] for p in content)}
    if content is None and message.get("role") == "assistant":
        return {**message, "content": ""}
    return message


def compatible_payload(payload: dict[str, Any], *, host: str | None) -> dict[str, Any]:
    """A Chat Completions request body with every message made `compatible_message`.

    Args:
        payload: The body langchain-openai built.
        host: The server's host name (None when unknown).

    """
    out = dict(payload)
    if isinstance(out.get("messages"), list):
        out["messages"] = [compatible_message(m) if isinstance(m, dict) else m
                           for m in out["messages"]]
    if host not in OPENAI_HOSTS and "max_completion_tokens" in out:
        out["max_tokens"] = out.pop("max_completion_tokens")
    return out


class CompatibleChatOpenAI(ChatOpenAI):
    """`ChatOpenAI` whose requests every OpenAI-compatible server accepts (`compatible_payload`)."""

    @override
    def _get_request_payload(
        self, input_: LanguageModelInput, *, stop: list[str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        return compatible_payload(payload, host=self.host)

    @property
    def host(self) -> str | None:
        """The host the client sends to (None before the client exists)."""
        return model_host(self)
