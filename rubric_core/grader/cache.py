"""Provider prompt-cache hints for a grader call: where its stable start ends, and a cache key.

Every provider caches only a byte-identical prompt start; `rubric_core.grader.prompt` lays the
grading request out so that start is long (instructions, criteria, request). Two providers
take a cheap hint on top, which `cache_hints` adds to each grader call the drivers make:

- Anthropic (a ``ChatAnthropic`` grader): caches nothing unless asked. The grading request
  becomes two text blocks, the stable start carrying ``"cache_control": {"type": "ephemeral"}``
  (its breakpoint, which also covers the tools and the system prompt before it) and the
  attempt after it; the text is unchanged (`message_text` of the message reads the same).
- OpenAI (a ``ChatOpenAI`` grader that talks to api.openai.com): caches prefixes of 1,024+
  tokens on its own; ``prompt_cache_key`` routes calls with the same key to the same cache.
  The key hashes the grader's instructions and the rubric's criteria, so every pass and every
  row graded with one rubric share it. It is sent only to OpenAI's own API: other
  OpenAI-compatible servers (local ones, gateways) may reject a parameter they do not know.

Providers are told apart by class name, so no provider package is imported here. Any other
model, and any message list without a grading request, is passed on unchanged.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import HumanMessage, SystemMessage

from rubric_core.grader.prompt import parse_grader_payload, split_grader_message
from rubric_core.grader.transcript import message_text

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain_core.messages import BaseMessage

CACHE_CONTROL = {"type": "ephemeral"}
"""Anthropic's cache breakpoint, put on the end of the grading request's stable start."""

PROMPT_CACHE_KEY_HOSTS = ("api.openai.com",)
"""Hosts that are sent ``prompt_cache_key``: OpenAI's own API only."""

Provider = Literal["anthropic", "openai"]


def chat_model(bound: Any) -> Any:
    """The chat model under a tool-bound (or otherwise bound) runnable."""
    seen = 0
    while hasattr(bound, "bound") and seen < 8:  # RunnableBinding from bind_tools / bind
        bound, seen = bound.bound, seen + 1
    return bound


def _host(model: Any) -> str | None:
    # The client's own base URL: where the requests really go, whichever setting chose it.
    for attr in ("root_client", "root_async_client"):
        base_url = getattr(getattr(model, attr, None), "base_url", None)
        host = getattr(base_url, "host", None)
        if isinstance(host, str):
            return host
    return None


def cache_provider(bound: Any) -> Provider | None:
    """Which provider's cache hint a grader model takes, if any (see the module text)."""
    model = chat_model(bound)
    names = {cls.__name__ for cls in type(model).__mro__}
    if "ChatAnthropic" in names:
        return "anthropic"
    if "ChatOpenAI" in names and "AzureChatOpenAI" not in names:
        return "openai" if _host(model) in PROMPT_CACHE_KEY_HOSTS else None
    return None


def _grading_request(messages: Sequence[BaseMessage]) -> int | None:
    """Index of the first message that is a grading request."""
    for i, message in enumerate(messages):
        if isinstance(message, HumanMessage) and split_grader_message(message_text(message)):
            return i
    return None


def prompt_cache_key(messages: Sequence[BaseMessage]) -> str | None:
    """The key of a grader call: a hash of its instructions and criteria; None without them.

    A custom system prompt that names the nonce is hashed with the nonce put back as
    ``NONCE``, so its calls still share one key per rubric.
    """
    index = _grading_request(messages)
    if index is None:
        return None
    text = message_text(messages[index])
    split, payload = split_grader_message(text), parse_grader_payload(text)
    if split is None or payload is None:
        return None
    system = "".join(message_text(m) for m in messages[:index] if isinstance(m, SystemMessage))
    material = json.dumps([system.replace(split.nonce, "NONCE"), payload.criteria])
    return "rubric-studio-grader-" + hashlib.sha256(material.encode()).hexdigest()[:32]


def with_cache_breakpoint(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """`messages` with the grading request split into its stable start (marked) and attempt."""
    out = list(messages)
    index = _grading_request(out)
    if index is None:
        return out
    split = split_grader_message(message_text(out[index]))
    if split is None:
        return out
    blocks: list[str | dict[str, Any]] = [
        {"type": "text", "text": split.stable, "cache_control": dict(CACHE_CONTROL)},
        {"type": "text", "text": split.attempt},
    ]
    out[index] = out[index].model_copy(update={"content": blocks})
    return out


def cache_hints(
    bound: Any, messages: Sequence[BaseMessage]
) -> tuple[list[BaseMessage], dict[str, Any]]:
    """The messages and call options to send `bound`, with its provider's cache hint.

    Returns:
        The messages (the grading request marked for Anthropic) and the keyword arguments for
        ``invoke`` (``prompt_cache_key`` for OpenAI); unchanged and empty for other models.

    """
    provider = cache_provider(bound)
    if provider == "anthropic":
        return with_cache_breakpoint(messages), {}
    if provider == "openai" and (key := prompt_cache_key(messages)) is not None:
        return list(messages), {"prompt_cache_key": key}
    return list(messages), {}
