"""Model strings to chat models: the parser, resolve_model, the resolver builder, PROVIDERS."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_openai import ChatOpenAI
from openai_server import DelayedServer, error, verdict

from rubric_core.models import BASE_URL_ENV, PROVIDERS, ModelConfigError, Provider, resolve_model

URL = "http://127.0.0.1:9/v1"  # never contacted: building a model makes no request
ROOT = Path(__file__).resolve().parents[1]


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


# ------------------------------------------------------------------------ one parser, one builder


@pytest.mark.parametrize(("spec", "expected"), [
    pytest.param("demo", ("demo", "", False), id="offline_worker"),
    pytest.param(" rules ", ("rules", "", False), id="offline_grader_stripped"),
    pytest.param("openai:gpt-4.1-mini", ("openai", "gpt-4.1-mini", False), id="provider"),
    pytest.param("openai-compatible:org/m:7b", ("openai-compatible", "org/m:7b", False),
                 id="model_id_keeps_its_colons"),
    pytest.param("hybrid:anthropic:claude", ("anthropic", "claude", True), id="hybrid"),
    pytest.param("hybrid: openai:m", ("openai", "m", True), id="hybrid_space_after_prefix"),
    pytest.param("gpt-4", ("gpt-4", "", False), id="no_provider"),
    pytest.param("", ("", "", False), id="empty"),
])
def test_parse_model_spec(spec: str, expected: tuple[str, str, bool]) -> None:
    from rubric_core.models import parse_model_spec

    parsed = parse_model_spec(spec)
    assert (parsed.provider, parsed.model_id, parsed.hybrid) == expected


@pytest.mark.parametrize(("spec", "uses"), [
    pytest.param("openai:m", True, id="openai"),
    pytest.param("openai-compatible:m", True, id="openai_compatible"),
    pytest.param("hybrid:openai-compatible:m", True, id="inside_hybrid"),
    pytest.param("anthropic:m", False, id="other_provider"),
    pytest.param("rules", False, id="offline"),
])
def test_every_caller_reads_the_openai_client_rule_from_the_parser(spec: str, uses: bool) -> None:
    from rubric_core.app_support import api_key_for, uses_openai_client
    from rubric_core.models import parse_model_spec

    assert parse_model_spec(spec).uses_openai_client is uses
    assert uses_openai_client(spec) is uses
    # The app's stored OpenAI key goes to an OpenAI-compatible model too, hybrid or not.
    assert (api_key_for(spec, {"OPENAI_API_KEY": "sk-x"}) == "sk-x") is uses


def test_demo_colon_is_still_a_malformed_string() -> None:
    with pytest.raises(ModelConfigError, match="is not 'provider:model-id'"):
        resolve_model("demo:")


def test_an_experiments_models_share_the_backoff_on_both_clients_and_do_not_stream() -> None:
    from rubric_core.experiments import SharedBackoff, experiment_models

    backoff = SharedBackoff()
    models = experiment_models(backoff, api_key="test-key")
    worker = models("openai-compatible:m", "worker", URL)
    assert isinstance(worker, ChatOpenAI)
    assert worker.http_client is backoff.http_client()
    assert worker.http_async_client is backoff.http_async_client()
    assert worker.disable_streaming is True
    # One model per model string and endpoint, whatever the role: one compiled agent.
    assert models("openai-compatible:m", "grader", URL) is worker
    assert models("openai-compatible:m", "worker", "http://127.0.0.1:8/v1") is not worker
    hybrid = models("hybrid:openai-compatible:m", "grader", URL)
    assert hybrid.llm.http_async_client is backoff.http_async_client()  # type: ignore[attr-defined]


def test_a_run_resolver_streams_and_builds_afresh() -> None:
    from rubric_core.models import model_resolver

    models = model_resolver(api_key="test-key", token_delay_s=0.5)
    worker = models("openai-compatible:m", "worker", URL)
    assert isinstance(worker, ChatOpenAI) and not worker.disable_streaming
    assert models("openai-compatible:m", "worker", URL) is not worker
    assert models("demo", "worker", None).token_delay_s == 0.5  # type: ignore[attr-defined]
    assert models("demo", "grader", None).token_delay_s == 0.0  # type: ignore[attr-defined]


def test_cli_eval_sends_through_the_shared_backoff_without_streaming(tmp_path: Path) -> None:
    # `eval` builds its models with experiments.experiment_models: a 429 is absorbed by the
    # shared backoff (the async client's: cells run on the experiments' event loop), and no
    # request asks for a stream nobody reads.
    db, data = tmp_path / "db.sqlite3", tmp_path / "q.csv"
    data.write_text("prompt\n" + "".join(f"question {i}\n" for i in range(4)), encoding="utf-8")
    server = DelayedServer(delay_s=0.0, grader_reply=verdict(
        "satisfied", "fine", ["answers the question"]))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "test-key"}
    with server.fake:
        server.fake.enqueue(error(429, "slow down"))
        proc = subprocess.run(
            [sys.executable, "-m", "rubric_core", "eval", "--dataset", str(data), "--rubric",
             "- answers the question", "--config",
             f"worker=openai-compatible:w,grader=openai-compatible:g,"
             f"base_url={server.fake.base_url}", "--db", str(db), "--concurrency", "2"],
            env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4/4 done, 100% satisfied" in proc.stdout
    assert "server answered 429" in proc.stdout and "(1 so far)" in proc.stdout
    assert len(server.fake.requests) == 1 + 4 * 2  # the 429, then a worker and a grader call
    assert not any(body.get("stream") for body in server.fake.requests)
