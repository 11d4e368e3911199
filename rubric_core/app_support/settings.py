"""Settings and database (the sidebar): secrets, the database path, models and their keys."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rubric_core.app_support._common import (
    DEFAULT_TOKEN_DELAY_S,
    FORM_DEFAULTS,
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    PACED_GRADER_PAUSE_S,
    PACED_TOKEN_DELAY_S,
    TOKEN_DELAY_ENV,
)
from rubric_core.models import (
    BASE_URL_ENV,
    PROVIDERS,
    ModelConfigError,
    parse_model_spec,
    resolve_model,
)
from rubric_core.settings import validate_judging
from rubric_core.store import default_db_path
from rubric_core.store import is_url as is_db_url

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping, Sequence

    from langchain_core.language_models import BaseChatModel

    from rubric_core.server_models import ServerModels


def safe_mapping(source: Any) -> dict[str, Any]:
    """A plain dict copy of a mapping that may fail to load (``st.secrets`` without a file).

    Args:
        source: A mapping, or an object whose iteration raises when it has no content.

    Returns:
        Its items, or an empty dict when reading it raised.

    """
    try:
        return {str(k): source[k] for k in source}
    except Exception:  # st.secrets raises its own error type when no secrets file exists
        return {}


def resolve_db_path(session_value: object, secrets: Mapping[str, Any]) -> Path | str:
    """The database the app uses: session state (tests), then secrets, then the default.

    Args:
        session_value: ``st.session_state.get("db_path")``.
        secrets: The app's secrets.

    Returns:
        The path to open, or a ``postgresql://`` URL (kept as text: a path would fold its
        ``//``).

    """
    for value in (session_value, secrets.get("db_path")):
        if isinstance(value, str | Path) and str(value).strip():
            text = str(value).strip()
            return text if is_db_url(text) else Path(text).expanduser()
    return default_db_path()


def store_error_message(error: str) -> str:
    """The page text for a database that cannot be used."""
    return (
        f"The database cannot be used, so runs cannot be started, stored or reviewed. {error} "
        "Authoring still works; nothing was deleted or overwritten."
    )


def token_delay(env_value: str | None, override: object = None) -> float:
    """Seconds between the demo worker's chunks.

    Args:
        env_value: ``$RUBRIC_STUDIO_TOKEN_DELAY``.
        override: ``st.session_state["token_delay_s"]`` (tests set 0).

    Returns:
        The override, else the environment value, else :data:`DEFAULT_TOKEN_DELAY_S`.

    """
    for value in (override, env_value):
        if value is None or isinstance(value, bool) or value == "":
            continue
        try:
            delay = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if delay >= 0:
            return delay
    return DEFAULT_TOKEN_DELAY_S


def judging_from_widgets(repeats: object, consensus: object, best: object) -> dict[str, Any]:
    """The verdict-stability widgets' values as `RunSettings` fields, whatever they hold.

    A value that is not what the widget gives (a session tampered with, a float) becomes one
    that `check_judging` reports instead of an exception on the page: repeats that are not a
    whole number become 0.
    """
    count = 0
    if isinstance(repeats, int | float) and not isinstance(repeats, bool) and (
            float(repeats).is_integer()):
        count = int(repeats)
    return {"grader_repeats": count,
            "consensus": consensus if isinstance(consensus, str) else "",
            "return_best": best is True}


def max_tokens_from_widgets(worker: object, grader: object) -> dict[str, Any]:
    """The sidebar's output token limits as `RunSettings` fields (0 or not a number: None).

    None is the model's default (`rubric_core.models.limit_output`); a number the settings
    refuse (above `rubric_core.types.MAX_OUTPUT_TOKENS`) is passed on for them to report.
    """
    def limit(value: object) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return int(value) if float(value).is_integer() and value > 0 else None

    return {"worker_max_tokens": limit(worker), "grader_max_tokens": limit(grader)}


def check_judging(grader_repeats: int, consensus: str) -> str | None:
    """What is wrong with the verdict-stability options, said for the page; None when fine."""
    try:
        validate_judging(grader_repeats, consensus)
    except ValueError as exc:
        return f"Verdict stability: {exc}."
    return None


def check_max_iterations(value: object) -> tuple[int, str | None]:
    """Bring a max-iterations value into range.

    Returns:
        The value to use, and a message saying what was wrong (None when it was fine).

    """
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        return FORM_DEFAULTS["max_iterations"], (
            f"Max iterations {value!r} is not a whole number; it was reset to "
            f"{FORM_DEFAULTS['max_iterations']}. Choose a value from {MIN_ITERATIONS} to "
            f"{MAX_ITERATIONS}."
        )
    number = int(value)
    if MIN_ITERATIONS <= number <= MAX_ITERATIONS:
        return number, None
    clamped = min(max(number, MIN_ITERATIONS), MAX_ITERATIONS)
    return clamped, (
        f"Max iterations {number} is outside {MIN_ITERATIONS}–{MAX_ITERATIONS}; it was set to "
        f"{clamped}. Choose a value in that range."
    )


@dataclass(frozen=True)
class ModelChoice:
    """One entry of a model selectbox."""

    value: str
    """The model string passed to the runner."""
    reason: str | None = None
    """Why it cannot be used right now; None when it can."""

    @property
    def label(self) -> str:
        """What the selectbox shows."""
        return self.value if self.reason is None else f"{self.value} — unavailable: {self.reason}"


_OFFLINE_LABELS = {"demo": "demo (offline demo worker)", "rules": "rules (offline rules grader)"}


def model_label(choices: Sequence[ModelChoice], value: str) -> str:
    """The label for ``value`` among ``choices`` (the value itself when not listed)."""
    for choice in choices:
        if choice.value == value:
            if choice.reason is None:
                return _OFFLINE_LABELS.get(value, value)
            return choice.label
    return value


def provider_env(env: Mapping[str, str], secrets: Mapping[str, Any]) -> dict[str, str]:
    """The environment with API keys from secrets added (secrets win)."""
    merged = dict(env)
    merged.update({k: v for k, v in secrets.items() if isinstance(v, str) and k.endswith("_KEY")})
    return merged


def model_options(
    role: Literal["worker", "grader"],
    *,
    env: Mapping[str, str],
    secrets: Mapping[str, Any],
    base_url: str | None = None,
    current: str | None = None,
    server_models: Sequence[str] = (),
) -> list[ModelChoice]:
    """The models a sidebar selectbox offers; unavailable ones carry the reason.

    Args:
        role: ``worker`` lists ``demo`` first, ``grader`` lists ``rules`` and a hybrid grader.
        env: The process environment.
        secrets: The app's secrets (API keys there count as set).
        base_url: The OpenAI-compatible base URL typed in the sidebar.
        current: The selected value; added when it is not a listed one.
        server_models: The models the base URL's server lists (`server_models_for`),
            offered as ``openai-compatible:<id>`` right after the offline models.

    Returns:
        The choices, offline models first.

    """
    merged = provider_env(env, secrets)
    choices = [ModelChoice("demo" if role == "worker" else "rules")]
    base = (base_url or merged.get(BASE_URL_ENV) or "").strip()
    compat_reason = None if base else (
        f"set an OpenAI-compatible base URL in the sidebar or {BASE_URL_ENV}"
    )
    openai = next(p for p in PROVIDERS if p.name == "openai")
    if compat_reason is None and not openai.installed():
        compat_reason = openai.unavailable_reason({"OPENAI_API_KEY": "x"})
    listed = [f"openai-compatible:{m}" for m in server_models]
    for name in listed or ["openai-compatible:llama3.1"]:
        choices.append(ModelChoice(name, compat_reason))
    for provider in PROVIDERS:
        reason = provider.unavailable_reason(merged)
        if provider.name == "openai" and base and provider.installed():
            reason = None  # a local server needs no key
        choices.append(ModelChoice(provider.example, reason))
        if role == "grader":
            choices.append(ModelChoice(f"hybrid:{provider.example}", reason))
    if current and current not in {c.value for c in choices}:
        choices.append(ModelChoice(current))
    return choices


def api_key_for(model: str, secrets: Mapping[str, Any]) -> str | None:
    """The API key for a model string from secrets, or None (the environment is used then)."""
    provider = parse_model_spec(model).provider
    if provider == "openai-compatible":
        provider = "openai"
    for p in PROVIDERS:
        if p.name == provider and p.key_env:
            value = secrets.get(p.key_env)
            return value if isinstance(value, str) and value else None
    return None


def same_url(a: str, b: str) -> bool:
    """Whether two base URLs name the same server (case and a trailing slash aside)."""
    return a.strip().rstrip("/").lower() == b.strip().rstrip("/").lower()


def uses_openai_client(model: str) -> bool:
    """Whether a model string talks to the OpenAI SDK (``openai``, ``openai-compatible``)."""
    return parse_model_spec(model).uses_openai_client


def base_url_trusted(base_url: str | None, secrets: Mapping[str, Any]) -> bool:
    """Whether stored keys may go to ``base_url``.

    True when it is empty (the provider's own endpoint) or the one the operator configured
    (``base_url`` in secrets or ``$RUBRIC_STUDIO_BASE_URL``).
    """
    if not base_url or not base_url.strip():
        return True
    configured = base_url_default(os.environ, secrets)
    return bool(configured) and same_url(base_url, configured)


def model_key(
    model: str, *, base_url: str | None, secrets: Mapping[str, Any],
    session_key: str | None = None,
) -> tuple[str | None, bool]:
    """The app's key rule: the key a model gets, and whether the environment's may go too.

    A key from the environment or secrets goes only to the endpoint it was configured for:
    the provider's default, or the operator's base URL (`base_url_trusted`). A base URL typed
    into the app gets ``session_key`` (typed into the app for this session) or no key at all.

    Returns:
        ``(api_key, env_keys)`` for `rubric_core.models.resolve_model` (or the ``keys`` rule
        of `rubric_core.models.model_resolver`).

    """
    openai_client = uses_openai_client(model)
    if not openai_client or base_url_trusted(base_url, secrets):
        return (session_key if session_key and openai_client
                else api_key_for(model, secrets)), True
    return session_key or None, False


def build_model(
    model: str,
    *,
    base_url: str | None,
    secrets: Mapping[str, Any],
    token_delay_s: float = 0.0,
    session_key: str | None = None,
    http_client: Any = None,
) -> BaseChatModel:
    """Resolve a model string with its key (never stored), by the app's key rule (`model_key`).

    Args:
        model: The model string.
        base_url: The run's OpenAI-compatible base URL, if any.
        secrets: The app's secrets.
        token_delay_s: Seconds between the demo worker's chunks.
        session_key: The key typed in the sidebar for ``base_url``.
        http_client: For ``openai``/``openai-compatible`` models (also inside ``hybrid:``):
            the HTTP client to use, e.g. an experiment's shared-backoff client
            (`rubric_core.experiments.SharedBackoff.http_client`); ignored for others.

    Raises:
        ModelConfigError: Unknown provider, missing package or key, malformed string.

    """
    key, env_keys = model_key(model, base_url=base_url, secrets=secrets, session_key=session_key)
    extra = ({"http_client": http_client}
             if http_client is not None and uses_openai_client(model) else {})
    return resolve_model(model, base_url=base_url or None, api_key=key, env_keys=env_keys,
                         token_delay_s=token_delay_s, **extra)


def model_problem(
    model: str, *, base_url: str | None, secrets: Mapping[str, Any],
    session_key: str | None = None,
) -> str | None:
    """Why a model string cannot be used (the ``ModelConfigError`` message), or None."""
    try:
        build_model(model, base_url=base_url, secrets=secrets, session_key=session_key)
    except ModelConfigError as exc:
        return str(exc)
    return None


def base_url_default(env: Mapping[str, str], secrets: Mapping[str, Any]) -> str:
    """The base URL to start with: secrets' ``base_url``, else ``$RUBRIC_STUDIO_BASE_URL``."""
    value = secrets.get("base_url") or env.get(BASE_URL_ENV) or ""
    return str(value).strip()


def env_token_delay() -> str | None:
    """``$RUBRIC_STUDIO_TOKEN_DELAY`` (for :func:`token_delay`)."""
    return os.environ.get(TOKEN_DELAY_ENV)


SERVER_MODELS_TTL_S = 60.0
"""Seconds a base URL's model list is reused before the server is asked again."""


def server_key(base_url: str, *, secrets: Mapping[str, Any], env: Mapping[str, str],
               session_key: str | None) -> str | None:
    """The key to send when listing a base URL's models: only one configured for it.

    The operator's key (secrets, then the environment) for the operator's base URL
    (`base_url_trusted`); for a base URL typed in the app, the key typed for it, or none.
    """
    if base_url_trusted(base_url, secrets):
        stored = api_key_for("openai:x", secrets) or env.get("OPENAI_API_KEY")
        return session_key or stored or None
    return session_key or None


def server_models_for(
    state: MutableMapping[str, Any],
    base_url: str | None,
    *,
    api_key: str | None,
    now: float,
    lister: Callable[..., ServerModels] | None = None,
) -> ServerModels:
    """The models the base URL's server lists, asked at most every `SERVER_MODELS_TTL_S`.

    Remembered in the session (``state["_server_models"]``) per base URL, so the sidebar
    does not ask the server on every rerun. No base URL: an empty list, nothing asked.

    Args:
        state: Session state.
        base_url: The sidebar's base URL.
        api_key: `server_key` for it.
        now: ``time.monotonic()``.
        lister: `rubric_core.server_models.list_server_models` (tests pass their own).

    """
    from rubric_core.server_models import ServerModels, list_server_models

    url = (base_url or "").strip()
    if not url:
        return ServerModels()
    memo = state.get("_server_models")
    if isinstance(memo, tuple) and memo[0] == url and now - memo[1] < SERVER_MODELS_TTL_S:
        return memo[2]
    found = (lister or list_server_models)(url, api_key=api_key)
    state["_server_models"] = (url, now, found)
    return found


def demo_pacing(env_value: str | None, pace: object, override: object = None
                ) -> tuple[float, float]:
    """How the app paces the offline models: (seconds between demo pieces, grader pause).

    The offline ``demo`` and ``rules`` answer at once, so a newcomer never sees a run live;
    with ``pace`` (the sidebar's "Pace the offline demo", on by default) the demo worker
    streams slowly and the rules grader takes `PACED_GRADER_PAUSE_S` over each verdict. Real
    models are never slowed, and neither are the CLI nor anything run outside the app.
    ``$RUBRIC_STUDIO_TOKEN_DELAY`` (or a test's ``token_delay_s`` override), when set, is
    taken as it is and turns pacing off.
    """
    if override is not None or (env_value or "").strip():
        return token_delay(env_value, override), 0.0
    if pace is True:
        return PACED_TOKEN_DELAY_S, PACED_GRADER_PAUSE_S
    return DEFAULT_TOKEN_DELAY_S, 0.0
