"""Output token limits of the worker and the grader (``max_tokens``), and replies cut at them.

A limit is set per run, configuration or re-grade (`RunSettings.worker_max_tokens`,
``grader_max_tokens``; `GraderConfig.max_tokens`), from the CLI, the app's sidebar or the
configuration text, and reaches the request (`rubric_core.models.limit_output`). A reply cut
at it (``finish_reason: length``) is recorded as cut, and the worker is told so.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI
from openai_server import FakeOpenAI, text, tool_call

from rubric_core import session
from rubric_core.app_support import max_tokens_from_widgets, restore_draft, settings_from_state
from rubric_core.cli import build_parser, main
from rubric_core.cli._common import UsageError
from rubric_core.cli.eval import configurations
from rubric_core.cli.run import settings_from
from rubric_core.lab import GraderConfig
from rubric_core.middleware import ANSWER_CUT_NOTE
from rubric_core.models import limit_output, resolve_model
from rubric_core.offline.graders import HybridGrader, RulesGrader
from rubric_core.settings import ExperimentConfig, RunSettings
from rubric_core.store import Store
from rubric_core.types import DEFAULT_GRADER_MAX_TOKENS, DEFAULT_WORKER_MAX_TOKENS

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

RUBRIC = "- The poem has three lines"


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


# --------------------------------------------------------------------------- limit_output


def test_a_local_server_model_gets_the_default_and_a_set_limit_wins(server: FakeOpenAI) -> None:
    local = resolve_model("openai-compatible:m", base_url=server.base_url)
    assert limit_output(local, None, default=300).max_tokens == 300  # type: ignore[attr-defined]
    assert limit_output(local, 64, default=300).max_tokens == 64  # type: ignore[attr-defined]
    built = resolve_model("openai-compatible:m", base_url=server.base_url, max_tokens=10)
    assert limit_output(built, None, default=300) is built  # its own limit is kept


def test_hosted_models_keep_their_provider_limit_unless_one_is_set() -> None:
    """A reasoning model spends thousands of tokens first: no default of ours for them."""
    hosted = ChatOpenAI(model="o4-mini", api_key="k")  # type: ignore[arg-type]
    assert limit_output(hosted, None, default=300) is hosted
    assert limit_output(hosted, 900, default=300).max_tokens == 900  # type: ignore[attr-defined]
    claude = ChatAnthropic(model="claude-haiku-4-5", api_key="k")  # type: ignore[call-arg]
    assert limit_output(claude, 512).max_tokens == 512  # type: ignore[attr-defined]


def test_offline_models_have_no_limit_and_a_hybrid_limits_its_llm(server: FakeOpenAI) -> None:
    rules = RulesGrader()
    assert limit_output(rules, 100, default=300) is rules
    hybrid = limit_output(HybridGrader(llm=resolve_model("openai-compatible:m",
                                                         base_url=server.base_url)), 77)
    assert isinstance(hybrid, HybridGrader) and hybrid.llm.max_tokens == 77  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("value", "error"),
    [
        pytest.param(0, ValueError, id="zero"),
        pytest.param(2_000_000, ValueError, id="too_many"),
        pytest.param("64", TypeError, id="text"),
        pytest.param(True, TypeError, id="a_bool"),
    ],
)
def test_a_limit_out_of_range_is_refused(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="worker_max_tokens"):
        RunSettings(prompt="p", rubric=RUBRIC, worker_max_tokens=value).validate()


def test_limits_travel_with_the_settings_and_old_ones_have_none() -> None:
    settings = RunSettings(prompt="p", rubric=RUBRIC, worker_max_tokens=64, grader_max_tokens=512)
    assert RunSettings.from_json(settings.to_json()) == settings
    old = {"prompt": "p", "rubric": RUBRIC}  # recorded before the limits were kept
    assert RunSettings.from_dict(old).worker_max_tokens is None


def test_a_configuration_text_sets_the_limits() -> None:
    config = ExperimentConfig.from_assignments("worker=demo,max_tokens=64,grader_max_tokens=0")
    assert (config.worker_max_tokens, config.grader_max_tokens) == (64, None)
    from rubric_core.datasets import DatasetRow

    row = DatasetRow(id="r1", prompt="p", rubric=RUBRIC, variables={})
    assert config.settings_for(row).worker_max_tokens == 64
    with pytest.raises(ValueError, match="max_tokens"):
        GraderConfig(rubric=RUBRIC, max_tokens=-1).validate()


# --------------------------------------------------------------------------- CLI and app


def test_the_cli_sets_the_limits_of_run_eval_and_regrade(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "--prompt", "p", "--rubric", RUBRIC, "--max-tokens", "64",
                              "--grader-max-tokens", "0"])
    settings = settings_from(args)
    assert (settings.worker_max_tokens, settings.grader_max_tokens) == (64, None)
    args = parser.parse_args(["eval", "--dataset", "bundled", "--model", "demo",
                              "--grader-max-tokens", "300"])
    assert [c.grader_max_tokens for c in configurations(args)] == [300]
    with pytest.raises(UsageError, match="--max-tokens"):
        settings_from(parser.parse_args(["run", "--prompt", "p", "--rubric", RUBRIC,
                                         "--max-tokens", "-5"]))
    args = parser.parse_args(["regrade", "--answers", "bundled", "--grader-max-tokens", "200",
                              "--db", str(tmp_path / "db.sqlite3")])
    from rubric_core.cli.lab import _configs

    with Store(tmp_path / "db.sqlite3") as store:
        assert {c.max_tokens for c in _configs(args, store)} == {200}


def test_the_sidebar_limits_reach_the_settings_and_survive_a_reload() -> None:
    state: dict[str, Any] = {"prompt": "p", "rubric_text": RUBRIC, "worker_max_tokens": 64,
                             "grader_max_tokens": 0}
    settings = settings_from_state(state)
    assert (settings.worker_max_tokens, settings.grader_max_tokens) == (64, None)
    assert max_tokens_from_widgets(12.5, "x") == {"worker_max_tokens": None,
                                                  "grader_max_tokens": None}
    restored: dict[str, Any] = {}
    restore_draft(restored, {"worker_max_tokens": 128, "grader_max_tokens": "lots"})
    assert restored == {"worker_max_tokens": 128}  # a value of the wrong type stays out


# --------------------------------------------------------------------------- the requests


def _answer(body: dict[str, Any]) -> Any:
    """A haiku for the worker; a passing verdict for the grader (the request offering tools)."""
    if body.get("tools"):
        return tool_call("GraderResponse", {"criteria": {"The poem has three lines": {
            "passed": True, "gap": ""}}, "explanation": "ok", "result": "satisfied"})
    return text("one\ntwo\nthree")


def test_the_limits_reach_the_worker_and_the_grader_requests(tmp_path: Path,
                                                             server: FakeOpenAI) -> None:
    """The defaults for base-URL models, then the limits a run sets."""
    server.default = _answer
    with Store(tmp_path / "db.sqlite3") as store:
        for worker, grader in ((None, None), (64, 200)):
            settings = RunSettings(prompt="Write a haiku.", rubric=RUBRIC,
                                   worker_model="openai-compatible:m",
                                   grader_model="openai-compatible:g", base_url=server.base_url,
                                   worker_max_tokens=worker, grader_max_tokens=grader)
            with session.start(store, settings) as run:
                events = list(run)
            assert events[-1]["status"] == "satisfied"
            work, verdict = server.requests[-2:]
            assert work["max_tokens"] == (worker or DEFAULT_WORKER_MAX_TOKENS)
            assert verdict["max_tokens"] == (grader or DEFAULT_GRADER_MAX_TOKENS)


def test_a_cut_answer_is_recorded_and_the_worker_told(tmp_path: Path,
                                                      server: FakeOpenAI) -> None:
    server.enqueue(text("Spring rain on the hill and", finish_reason="length"),
                   text("Spring rain\nsoft light\nbirds sing"))
    settings = RunSettings(prompt="Write a haiku.", rubric=RUBRIC,
                           worker_model="openai-compatible:m", grader_model="rules",
                           base_url=server.base_url, worker_max_tokens=8)
    with Store(tmp_path / "db.sqlite3") as store, session.start(store, settings) as run:
        events = list(run)
    cut, fixed = [e["evaluation"] for e in events if e["type"] == "evaluation_finished"]
    assert cut["answer_cut"] is True and "answer_cut" not in fixed
    revision = server.requests[1]["messages"][-1]
    assert revision["role"] == "user" and ANSWER_CUT_NOTE in revision["content"]
    assert events[-1]["status"] == "satisfied"


def test_the_cli_says_when_an_answer_was_cut(server: FakeOpenAI) -> None:
    server.enqueue(text("Spring rain on", finish_reason="length"), text("a\nb\nc"))
    out = io.StringIO()
    main(["run", "--prompt", "Write a haiku.", "--rubric", RUBRIC, "--model",
          "openai-compatible:m", "--base-url", server.base_url, "--max-tokens", "4", "--no-db"],
         out)
    assert "cut off at the worker's output token limit" in out.getvalue()
    assert server.requests[0]["max_tokens"] == 4
