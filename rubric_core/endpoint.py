"""Which kind of server a chat model talks to, told without importing any provider package.

Providers are told apart by class name (as `rubric_core.grader.cache` does) and, for the
openai SDK's models, by the host their client sends to: OpenAI's own API, or an
OpenAI-compatible server (llama.cpp, vLLM, Ollama, LM Studio, a gateway). Importing
langchain-openai costs over a second, so nothing here does.
"""

from __future__ import annotations

from typing import Any

OPENAI_HOSTS = ("api.openai.com",)
"""Hosts of OpenAI's own API."""


def class_names(model: Any) -> set[str]:
    """The names of a model's class and its bases."""
    return {cls.__name__ for cls in type(model).__mro__}


def model_host(model: Any) -> str | None:
    """The host an openai-SDK chat model sends to (its client's base URL); None for others."""
    for attr in ("root_client", "root_async_client"):
        base_url = getattr(getattr(model, attr, None), "base_url", None)
        host = getattr(base_url, "host", None)
        if isinstance(host, str):
            return host
    return None


def is_openai_compatible(model: Any) -> bool:
    """Whether a chat model talks to an OpenAI-compatible server that is not OpenAI's own."""
    return ("ChatOpenAI" in class_names(model) and "AzureChatOpenAI" not in class_names(model)
            and model_host(model) not in OPENAI_HOSTS)


def is_openai_own(model: Any) -> bool:
    """Whether a chat model talks to OpenAI's own API."""
    return "ChatOpenAI" in class_names(model) and model_host(model) in OPENAI_HOSTS
