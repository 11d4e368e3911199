"""Model strings to chat models: offline models, LangChain providers, OpenAI-compatible servers.

Accepted model strings:

- ``demo``: the offline demo worker (knows the bundled examples; no key, no network).
- ``rules``: the offline rules grader (checks countable criteria with the evidence tools).
- ``hybrid:<model>``: rules for the criteria they can check, the LLM ``<model>`` for the rest.
- ``openai-compatible:<model-id>``: an OpenAI-compatible server (Ollama, vLLM, LM Studio…) at
  ``base_url`` / ``RUBRIC_STUDIO_BASE_URL``; the key is optional.
- ``<provider>:<model-id>``: any LangChain provider whose package is installed, resolved with
  ``init_chat_model`` (``openai:gpt-4.1-mini``, ``anthropic:claude-haiku-4-5``…).

One parser reads these strings (`parse_model_spec`), one function builds a model from one
(`resolve_model`), and one builder makes the `ModelResolver` that runs and experiments get
(`model_resolver`: which key goes where, the shared backoff, one model per string, streaming):
the app's single runs and experiments and the CLI all call it.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from langchain_core.language_models import BaseChatModel

    from rubric_core.http_retry import SharedBackoff
    from rubric_core.types import ModelResolver, Role

BASE_URL_ENV = "RUBRIC_STUDIO_BASE_URL"
"""Environment variable with the base URL of an OpenAI-compatible server."""


class ModelConfigError(ValueError):
    """A model string that cannot be turned into a model, with what to do about it."""


HYBRID_PREFIX = "hybrid:"
"""Prefix of a hybrid grader's model string: ``hybrid:<model>``."""

OPENAI_CLIENT_PROVIDERS = frozenset({"openai", "openai-compatible"})
"""Providers whose models talk through the openai SDK's HTTP clients."""


@dataclass(frozen=True)
class ModelSpec:
    """A model string, read: which provider, which model, and whether rules grade first."""

    provider: str
    """``demo``, ``rules``, ``openai-compatible`` or a LangChain provider name; for a string
    without a colon, the whole string (``""`` when empty)."""
    model_id: str
    """What follows ``provider:`` (``""`` for the offline models and malformed strings)."""
    hybrid: bool
    """Whether the string was ``hybrid:<model>``: the other fields describe ``<model>``."""
    inner: str
    """The model string, stripped, without its ``hybrid:`` prefix."""

    @property
    def uses_openai_client(self) -> bool:
        """Whether the model (also inside ``hybrid:``) sends through the openai SDK's clients."""
        return self.provider in OPENAI_CLIENT_PROVIDERS


def parse_model_spec(spec: str) -> ModelSpec:
    """Read a model string (see the module docstring); never raises.

    Whitespace around the string, and after ``hybrid:``, is ignored. Whether the string names
    a model that can be built is `resolve_model`'s to say.

    Examples:
        >>> parse_model_spec("hybrid:openai:gpt-4.1")
        ModelSpec(provider='openai', model_id='gpt-4.1', hybrid=True, inner='openai:gpt-4.1')
        >>> parse_model_spec(" demo ")
        ModelSpec(provider='demo', model_id='', hybrid=False, inner='demo')

    """
    text = (spec or "").strip()
    hybrid = text.startswith(HYBRID_PREFIX)
    if hybrid:
        text = text.removeprefix(HYBRID_PREFIX).strip()
    provider, _, model_id = text.partition(":")
    return ModelSpec(provider, model_id, hybrid, text)


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
    parsed = parse_model_spec(spec)
    if parsed.hybrid:
        from rubric_core.offline.graders import HybridGrader

        inner = resolve_model(
            parsed.inner, base_url=base_url, api_key=api_key, timeout_s=timeout_s,
            env_keys=env_keys, **kwargs,
        )
        return HybridGrader(llm=inner)
    provider, model_id = parsed.provider, parsed.model_id
    if not parsed.inner:
        msg = "No model given. Use 'demo', 'rules' or 'provider:model-id'."
        raise ModelConfigError(msg)
    if parsed.inner == "demo":
        from rubric_core.offline.demo import DemoWorker

        return DemoWorker(token_delay_s=token_delay_s)
    if parsed.inner == "rules":
        from rubric_core.offline.graders import RulesGrader

        return RulesGrader()
    if not model_id:
        msg = (
            f"Model {spec.strip()!r} is not 'provider:model-id' (e.g. 'openai:gpt-4.1-mini'), "
            "nor one of the offline models 'demo' and 'rules'."
        )
        raise ModelConfigError(msg)
    base_url = base_url or os.environ.get(BASE_URL_ENV) or None
    if provider == "openai-compatible" or (provider == "openai" and base_url):
        if env_keys and api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY") or None
        return _openai_compatible(model_id, base_url, api_key, timeout_s, **kwargs)
    return _init_provider(provider, model_id, api_key, timeout_s, **kwargs)


OUTPUT_LIMIT_FIELDS = {"ChatOllama": "num_predict", "ChatGoogleGenerativeAI": "max_output_tokens"}
"""Chat model classes whose output token limit is not their ``max_tokens`` field."""


def limit_output(model: BaseChatModel, max_tokens: int | None, *, default: int | None = None
                 ) -> BaseChatModel:
    """``model`` with its replies stopped at ``max_tokens`` output tokens.

    Args:
        model: A chat model (a ``hybrid:`` grader's LLM is limited inside it).
        max_tokens: The limit; None: ``default`` for a model on an OpenAI-compatible base URL
            (a local server, whose small model may never stop) built without a limit of its
            own, and the provider's own limit for every other model.
        default: The limit a base-URL model gets when ``max_tokens`` is None.

    Returns:
        A copy with the limit set (its clients shared), or ``model`` itself when nothing is
        to be set or the model has no output limit (the offline models).

    """
    from rubric_core.endpoint import class_names, is_openai_compatible
    from rubric_core.offline.graders import HybridGrader

    if isinstance(model, HybridGrader):
        inner = limit_output(model.llm, max_tokens, default=default)
        return model if inner is model.llm else model.model_copy(update={"llm": inner})
    names = class_names(model)
    field = next((f for c, f in OUTPUT_LIMIT_FIELDS.items() if c in names), "max_tokens")
    if field not in type(model).model_fields:
        return model
    if max_tokens is None:  # the default never replaces a limit the model was built with
        own = getattr(model, field, None) is not None
        max_tokens = default if is_openai_compatible(model) and not own else None
    if max_tokens is None or getattr(model, field, None) == max_tokens:
        return model
    return model.model_copy(update={field: max_tokens})


def model_resolver(
    *,
    api_key: str | None = None,
    env_keys: bool = True,
    keys: Callable[[str, str | None], tuple[str | None, bool]] | None = None,
    backoff: SharedBackoff | None = None,
    share: bool = False,
    streaming: bool = True,
    token_delay_s: float = 0.0,
) -> ModelResolver:
    """The `ModelResolver` runs and experiments are given: every caller's models are built here.

    The app's single runs (its key rule, streaming), its experiments and the CLI's (the shared
    backoff, one model per string, no streaming) differ only in these arguments.

    Args:
        api_key: The key for every model's endpoint (never stored); the environment's when
            None. Ignored when ``keys`` is given.
        env_keys: Whether a base URL may receive ``OPENAI_API_KEY`` from the environment (see
            `resolve_model`). Ignored when ``keys`` is given.
        keys: The key rule: ``(model string, base URL) -> (api_key, env_keys)`` for each model
            (the app's: a stored key goes only to the endpoint it was configured for).
        backoff: OpenAI and OpenAI-compatible models (also inside ``hybrid:``) send through
            its HTTP clients, sync and async, so a 429 or 5xx slows every request down instead
            of failing one (`rubric_core.http_retry.SharedBackoff`).
        share: Build one model per model string and endpoint for the resolver's life, whatever
            the role (chat models are safe to share between threads and tasks): every run with
            the same models then reuses one compiled agent (`rubric_core.runner.build_agent`
            keeps them by their models' identity). Thread-safe.
        streaming: False for runs nobody watches: one response per call costs a fraction of
            the CPU of a stream of chunks, and under the GIL CPU limits concurrent runs.
        token_delay_s: Seconds between the offline demo worker's chunks (its worker role only).

    """
    built: dict[tuple[str, str | None, float], BaseChatModel] = {}
    lock = threading.Lock()

    def build(model: str, role: Role, base_url: str | None) -> BaseChatModel:
        key, env = keys(model, base_url) if keys is not None else (api_key, env_keys)
        extra: dict[str, Any] = {} if streaming else {"disable_streaming": True}
        if backoff is not None and parse_model_spec(model).uses_openai_client:
            extra["http_client"] = backoff.http_client()
            extra["http_async_client"] = backoff.http_async_client()
        return resolve_model(model, base_url=base_url, api_key=key, env_keys=env,
                             token_delay_s=token_delay_s if role == "worker" else 0.0, **extra)

    if not share:
        return build

    def shared(model: str, role: Role, base_url: str | None) -> BaseChatModel:
        delay = token_delay_s if role == "worker" else 0.0
        with lock:
            if (model, base_url, delay) not in built:
                built[model, base_url, delay] = build(model, role, base_url)
            return built[model, base_url, delay]

    return shared


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
    from rubric_core.openai_compat import CompatibleChatOpenAI

    # Never None: ChatOpenAI would read OPENAI_API_KEY itself and send it to this URL.
    key = api_key or "not-needed"
    # Our grader retries transport errors itself; the client's own retries would multiply them.
    kwargs.setdefault("max_retries", 0)
    # Under stream_events both models stream, and ChatOpenAI asks a non-OpenAI base URL for
    # usage only when told to: without this the evaluations' token counts stay empty.
    kwargs.setdefault("stream_usage", True)
    # Messages every OpenAI-compatible server accepts (rubric_core.openai_compat).
    return CompatibleChatOpenAI(model=model_id, base_url=base_url,
                                api_key=key,  # type: ignore[arg-type]
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
