"""resolve_model and PROVIDERS: model strings to chat models, and clear errors for bad ones."""

from __future__ import annotations

import os
import re

import pytest
from langchain_openai import ChatOpenAI

from rubric_core.models import BASE_URL_ENV, PROVIDERS, ModelConfigError, Provider, resolve_model

URL = "http://127.0.0.1:9/v1"  # never contacted: building a model makes no request


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.endswith("_API_KEY") or name == BASE_URL_ENV:
            monkeypatch.delenv(name)


# --------------------------------------------------------------------------- offline models


def test_demo_and_rules_are_offline_models() -> None:
    from rubric_core.offline import DemoWorker, RulesGrader

    demo = resolve_model("demo", token_delay_s=0.01)
    assert isinstance(demo, DemoWorker) and demo.token_delay_s == 0.01
    assert isinstance(resolve_model(" rules "), RulesGrader)


def test_hybrid_wraps_an_openai_compatible_llm() -> None:
    from rubric_core.offline import HybridGrader

    model = resolve_model("hybrid:openai-compatible:local-llm", base_url=URL)
    assert isinstance(model, HybridGrader)
    assert isinstance(model.llm, ChatOpenAI)
    assert model.llm.model_name == "local-llm"
    assert str(model.llm.openai_api_base) == URL


def test_hybrid_passes_errors_of_its_inner_model_through() -> None:
    with pytest.raises(ModelConfigError, match=BASE_URL_ENV):
        resolve_model("hybrid:openai-compatible:x")


# --------------------------------------------------------------------------- openai-compatible


def test_openai_compatible_client_settings() -> None:
    model = resolve_model("openai-compatible:qwen2.5", base_url=URL, timeout_s=7)
    assert isinstance(model, ChatOpenAI)
    assert model.model_name == "qwen2.5" and str(model.openai_api_base) == URL
    assert model.max_retries == 0  # the grader retries; client retries would multiply them
    assert model.request_timeout == 7
    assert model.stream_usage is True  # token counts under stream_events
    assert model.openai_api_key is not None
    assert model.openai_api_key.get_secret_value() == "not-needed"


def test_openai_compatible_base_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BASE_URL_ENV, URL)
    model = resolve_model("openai-compatible:m", api_key="sk-local")
    assert isinstance(model, ChatOpenAI) and str(model.openai_api_base) == URL
    assert model.openai_api_key is not None
    assert model.openai_api_key.get_secret_value() == "sk-local"


def test_openai_with_base_url_goes_to_that_server_without_a_key() -> None:
    model = resolve_model("openai:gpt-4.1-mini", base_url=URL)
    assert isinstance(model, ChatOpenAI) and str(model.openai_api_base) == URL


def test_caller_kwargs_win_over_defaults() -> None:
    model = resolve_model("openai-compatible:m", base_url=URL, max_retries=3, stream_usage=False)
    assert isinstance(model, ChatOpenAI)
    assert model.max_retries == 3 and model.stream_usage is False


# --------------------------------------------------------------------------- providers


def test_openai_with_key_is_chat_openai_without_client_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    model = resolve_model("openai:gpt-4.1-mini", timeout_s=9)
    assert isinstance(model, ChatOpenAI)
    assert model.model_name == "gpt-4.1-mini"
    assert model.max_retries == 0 and model.request_timeout == 9


def test_explicit_api_key_stands_in_for_the_environment() -> None:
    model = resolve_model("openai:gpt-4.1-mini", api_key="sk-explicit")
    assert isinstance(model, ChatOpenAI) and model.openai_api_key is not None
    assert model.openai_api_key.get_secret_value() == "sk-explicit"


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        pytest.param("", {}, "No model given", id="empty"),
        pytest.param("   ", {}, "No model given", id="blank"),
        pytest.param("noprovider", {}, "is not 'provider:model-id'", id="no_provider"),
        pytest.param("openai:", {}, "is not 'provider:model-id'", id="no_model_id"),
        pytest.param("nope:x", {}, "Unsupported provider='nope'", id="unknown_provider"),
        pytest.param("openai-compatible:x", {}, BASE_URL_ENV, id="compatible_without_url"),
        pytest.param("openai-compatible:x", {"base_url": "ftp://host/v1"},
                     "must start with http:// or https://", id="bad_url_scheme"),
        pytest.param("openai-compatible:x", {"base_url": "127.0.0.1:8000"},
                     "must start with http:// or https://", id="url_without_scheme"),
        pytest.param("openai:gpt-4.1-mini", {}, "needs an API key: OPENAI_API_KEY is not set",
                     id="openai_without_key"),
        pytest.param("anthropic:claude-haiku-4-5", {}, "ANTHROPIC_API_KEY",
                     id="anthropic_without_key"),
    ],
)
def test_unusable_model_strings_raise_model_config_error(
    spec: str, kwargs: dict[str, str], message: str
) -> None:
    with pytest.raises(ModelConfigError, match=re.escape(message)):
        resolve_model(spec, **kwargs)


def test_model_config_error_is_a_value_error() -> None:
    assert issubclass(ModelConfigError, ValueError)


def test_provider_not_installed_is_reported_before_the_key() -> None:
    ghost = Provider("ghost", "langchain-ghost", "langchain_ghost_not_installed", "GHOST_KEY",
                     "ghost:m")
    assert not ghost.installed()
    assert ghost.unavailable_reason({"GHOST_KEY": "x"}) == (
        "package langchain-ghost is not installed (pip install langchain-ghost)")


def test_provider_missing_key_and_keyless_providers() -> None:
    openai = next(p for p in PROVIDERS if p.name == "openai")
    assert openai.installed()
    assert openai.unavailable_reason({}) == "OPENAI_API_KEY is not set"
    assert openai.unavailable_reason({"OPENAI_API_KEY": ""}) == "OPENAI_API_KEY is not set"
    assert openai.unavailable_reason({"OPENAI_API_KEY": "sk"}) is None
    keyless = Provider("local", "langchain-openai", "langchain_openai", None, "local:m")
    assert keyless.unavailable_reason({}) is None


def test_provider_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    openai = next(p for p in PROVIDERS if p.name == "openai")
    assert openai.unavailable_reason() == "OPENAI_API_KEY is not set"
    monkeypatch.setenv("OPENAI_API_KEY", "sk")
    assert openai.unavailable_reason() is None


def test_providers_table_is_consistent() -> None:
    names = [p.name for p in PROVIDERS]
    assert len(names) == len(set(names))
    for p in PROVIDERS:
        assert p.example.startswith(f"{p.name}:")
        assert p.package.replace("-", "_") == p.module
