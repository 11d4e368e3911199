"""Model strings to chat models: offline models, LangChain providers, OpenAI-compatible servers.

Accepted model strings:

- ``demo``: the offline demo worker (knows the bundled examples; no key, no network).
- ``rules``: the offline rules grader (checks countable criteria with the evidence tools).
- ``hybrid:<model>``: rules for the criteria they can check, the LLM ``<model>`` for the rest.
- ``openai-compatible:<model-id>``: an OpenAI-compatible server (Ollama, vLLM, LM Studio…) at
  ``base_url`` / ``RUBRIC_STUDIO_BASE_URL``; the key is optional.
- ``<provider>:<model-id>``: any LangChain provider whose package is installed, resolved with
  ``init_chat_model`` (``openai:gpt-4.1-mini``, ``anthropic:claude-haiku-4-5``…).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from langchain_core.language_models import BaseChatModel

BASE_URL_ENV = "RUBRIC_STUDIO_BASE_URL"
"""Environment variable with the base URL of an OpenAI-compatible server."""


class ModelConfigError(ValueError):
    """A model string that cannot be turned into a model, with what to do about it."""


@dataclass(frozen=True)
class Provider:
    """A LangChain provider the app can offer."""

    name: str
    package: str
    module: str
    key_env: str | None
    example: str

    def installed(self) -> bool:
        """Whether the provider's LangChain package can be imported."""
        return importlib.util.find_spec(self.module) is not None

    def unavailable_reason(self, env: Mapping[str, str] | None = None) -> str | None:
        """Why the provider cannot be used right now, or None when it can."""
        env = os.environ if env is None else env
        if not self.installed():
            return f"package {self.package} is not installed (pip install {self.package})"
        if self.key_env and not env.get(self.key_env):
            return f"{self.key_env} is not set"
        return None


PROVIDERS: tuple[Provider, ...] = (
    Provider("openai", "langchain-openai", "langchain_openai", "OPENAI_API_KEY",
             "openai:gpt-4.1-mini"),
    Provider("anthropic", "langchain-anthropic", "langchain_anthropic", "ANTHROPIC_API_KEY",
             "anthropic:claude-haiku-4-5"),
    Provider("google_genai", "langchain-google-genai", "langchain_google_genai",
             "GOOGLE_API_KEY", "google_genai:gemini-2.5-flash"),
    Provider("ollama", "langchain-ollama", "langchain_ollama", None, "ollama:llama3.1"),
    Provider("groq", "langchain-groq", "langchain_groq", "GROQ_API_KEY",
             "groq:llama-3.3-70b-versatile"),
    Provider("mistralai", "langchain-mistralai", "langchain_mistralai", "MISTRAL_API_KEY",
             "mistralai:mistral-small-latest"),
)
_BY_NAME = {p.name: p for p in PROVIDERS}


def resolve_model(
    spec: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout_s: float | None = 120.0,
    token_delay_s: float = 0.0,
    env_keys: bool = True,
    **kwargs: Any,
) -> BaseChatModel:
    """Turn a model string into a chat model.

    Args:
        spec: A model string (see the module docstring).
        base_url: OpenAI-compatible endpoint for ``openai-compatible:`` (or ``openai:``) models.
        api_key: Overrides the key from the environment (never stored by Rubric Studio).
        timeout_s: Per-request timeout for network models.
        token_delay_s: Delay between streamed chunks of the demo worker (for a visible stream).
        env_keys: Whether an OpenAI-compatible ``base_url`` may receive ``OPENAI_API_KEY`` from
            the environment. Pass False for a base URL that did not come from the operator
            (one typed into the app): then only ``api_key`` is sent there.
        **kwargs: Passed to the provider's chat model.

    Raises:
        ModelConfigError: Unknown provider, missing package or key, malformed string.

    """
    spec = (spec or "").strip()
    if not spec:
        msg = "No model given. Use 'demo', 'rules' or 'provider:model-id'."
        raise ModelConfigError(msg)
    if spec == "demo":
        from rubric_core.offline.demo import DemoWorker

        return DemoWorker(token_delay_s=token_delay_s)
    if spec == "rules":
        from rubric_core.offline.graders import RulesGrader

        return RulesGrader()
    if spec.startswith("hybrid:"):
        from rubric_core.offline.graders import HybridGrader

        inner = resolve_model(
            spec.removeprefix("hybrid:"), base_url=base_url, api_key=api_key,
            timeout_s=timeout_s, env_keys=env_keys, **kwargs,
        )
        return HybridGrader(llm=inner)
    provider, sep, model_id = spec.partition(":")
    if not sep or not model_id:
        msg = (
            f"Model {spec!r} is not 'provider:model-id' (e.g. 'openai:gpt-4.1-mini'), nor one "
            "of the offline models 'demo' and 'rules'."
        )
        raise ModelConfigError(msg)
    base_url = base_url or os.environ.get(BASE_URL_ENV) or None
    if provider == "openai-compatible" or (provider == "openai" and base_url):
        if env_keys and api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY") or None
        return _openai_compatible(model_id, base_url, api_key, timeout_s, **kwargs)
    return _init_provider(provider, model_id, api_key, timeout_s, **kwargs)


def _openai_compatible(
    model_id: str, base_url: str | None, api_key: str | None, timeout_s: float | None,
    **kwargs: Any,
) -> BaseChatModel:
    if not base_url:
        msg = f"'openai-compatible:{model_id}' needs a base URL: set {BASE_URL_ENV} or base_url."
        raise ModelConfigError(msg)
    if not base_url.startswith(("http://", "https://")):
        msg = f"Base URL {base_url!r} must start with http:// or https://"
        raise ModelConfigError(msg)
    from langchain_openai import ChatOpenAI

    # Never None: ChatOpenAI would read OPENAI_API_KEY itself and send it to this URL.
    key = api_key or "not-needed"
    # Our grader retries transport errors itself; the client's own retries would multiply them.
    kwargs.setdefault("max_retries", 0)
    # Under stream_events both models stream, and ChatOpenAI asks a non-OpenAI base URL for
    # usage only when told to: without this the evaluations' token counts stay empty.
    kwargs.setdefault("stream_usage", True)
    return ChatOpenAI(model=model_id, base_url=base_url, api_key=key,  # type: ignore[arg-type]
                      timeout=timeout_s, **kwargs)


def _init_provider(
    provider: str, model_id: str, api_key: str | None, timeout_s: float | None, **kwargs: Any
) -> BaseChatModel:
    from langchain.chat_models import init_chat_model

    known = _BY_NAME.get(provider)
    if known is not None:
        reason = known.unavailable_reason() if api_key is None else None
        if reason and not known.installed():
            msg = f"Provider {provider!r} is unavailable: {reason}."
            raise ModelConfigError(msg)
        if reason:
            msg = (f"Provider {provider!r} needs an API key: {reason}. Set it in the "
                   "environment or in .streamlit/secrets.toml.")
            raise ModelConfigError(msg)
    if api_key is not None:
        kwargs["api_key"] = api_key
    if timeout_s is not None:
        kwargs.setdefault("timeout", timeout_s)
    if provider in ("openai", "anthropic"):
        kwargs.setdefault("max_retries", 0)
    try:
        return init_chat_model(model_id, model_provider=provider, **kwargs)
    except ImportError as exc:
        msg = f"Provider {provider!r} needs a package that is not installed: {exc}"
        raise ModelConfigError(msg) from exc
    except ValueError as exc:
        msg = f"Cannot use model '{provider}:{model_id}': {exc}"
        raise ModelConfigError(msg) from exc
    except Exception as exc:  # provider clients raise their own types for bad credentials
        msg = f"Cannot create model '{provider}:{model_id}': {type(exc).__name__}: {exc}"
        raise ModelConfigError(msg) from exc
