"""The loop, the grader, Stop and Resume, experiments, the lab and the app on a real server.

llama.cpp's own ``llama-server`` serving SmolLM2-135M-Instruct (tests/llama_support.py; one
server for the whole run, the ``llama_url`` fixture), sampled at temperature 0 with a fixed
seed. The tiny model's wording is never asserted, only structure: the statuses a run may end
in, complete verdicts (every criterion by name, with a boolean), a loop that revised, one
ending per Stop and per Resume. Where the model's own choice would decide (a first answer
that passes), the rubric holds a criterion the ``rules`` grader checks and the model cannot
meet by chance (it mentions "quokka"), so the first pass fails.

This build of ``llama-server`` ignores tools for SmolLM2's chat template (it has no tool
support), so its verdicts come by the JSON-schema ``response_format`` (`rubric_core.grader.
verdict`); tests/test_real_python_server.py covers llama.cpp's Python server, which honours a
named ``tool_choice``.
"""

from __future__ import annotations

import re
import threading
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from llama_support import sampling
from pydantic import Field

from rubric_core import RubricMiddleware, session
from rubric_core.datasets import parse_dataset
from rubric_core.experiments import create_experiment, experiment_results, run_experiment
from rubric_core.lab import GraderConfig, create_regrade, parse_answers, run_regrade
from rubric_core.local_model import MODEL_STRING
from rubric_core.models import resolve_model
from rubric_core.rubric import parse_criteria
from rubric_core.settings import ExperimentConfig, RunSettings
from rubric_core.store import Store
from rubric_core.tools import count_syllables as count_syllables_of

if TYPE_CHECKING:
    from pathlib import Path

    from rubric_core.types import ModelResolver, RubricEvaluation

pytestmark = pytest.mark.real_model

PROMPT = "Write a haiku about spring."
RULES_RUBRIC = '- The poem has three lines\n- Mentions "quokka"'
"""Checked by ``rules``; no first answer mentions a quokka, so the loop revises."""
HYBRID_RUBRIC = '- Mentions "quokka"\n- The poem sounds cheerful'
"""The rules decide the first, the model the second."""
ENDINGS = {"satisfied", "max_iterations_reached"}
"""How a run that revises up to its cap may end."""
RESULTS = {"satisfied", "needs_revision", "failed"}
"""A pass's verdict when the grader gave one (never ``grader_error``)."""


def real_models() -> ModelResolver:
    """Models built as the app's are, sampled at temperature 0 with the tests' seed."""
    def build(model: str, _role: str, base_url: str | None) -> Any:
        return resolve_model(model, base_url=base_url, timeout_s=180, **sampling())

    return build  # type: ignore[return-value]


def assert_complete(evaluation: RubricEvaluation, rubric: str) -> None:
    """A verdict on every criterion, by its name, with a boolean."""
    assert evaluation["result"] in RESULTS, evaluation["explanation"]
    names = [c["name"] for c in evaluation["criteria"]]
    assert names == parse_criteria(rubric)
    assert all(isinstance(c["passed"], bool) for c in evaluation["criteria"])
    assert not evaluation["unverified"]


def run_to_end(store: Store, settings: RunSettings) -> list[dict[str, Any]]:
    with session.start(store, settings, models=real_models()) as run:
        return list(run)


def test_a_run_revises_with_the_real_worker_and_rules(tmp_path: Path, llama_url: str) -> None:
    settings = RunSettings(prompt=PROMPT, rubric=RULES_RUBRIC, worker_model=MODEL_STRING,
                           grader_model="rules", base_url=llama_url, max_iterations=2,
                           worker_max_tokens=48)
    with Store(tmp_path / "db.sqlite3") as store:
        events = run_to_end(store, settings)
        first, second = store.evaluations(store.list_runs()[0].run_id)
    assert [e["type"] for e in events].count("run_finished") == 1
    assert events[-1]["status"] in ENDINGS and events[-1]["error"] is None
    assert first["result"] == "needs_revision" and first["status"] == "needs_revision"
    assert second["iteration"] == 1 and second["status"] in ENDINGS
    # The revision went back to the server with the worker's own answer (a string: the
    # Python server refused the list of parts) and was answered.
    assert second["answer"].strip()


def test_a_run_revises_with_the_real_worker_and_a_real_grader(tmp_path: Path,
                                                              llama_url: str) -> None:
    settings = RunSettings(prompt=PROMPT, rubric=HYBRID_RUBRIC, worker_model=MODEL_STRING,
                           grader_model=f"hybrid:{MODEL_STRING}", base_url=llama_url,
                           max_iterations=2, worker_max_tokens=48, grader_max_tokens=500)
    with Store(tmp_path / "db.sqlite3") as store:
        events = run_to_end(store, settings)
        run = store.list_runs()[0]
        evaluations = store.evaluations(run.run_id)
        calls = store.calls(run.run_id)
    assert events[-1]["status"] in ENDINGS | {"failed"}, events[-1]
    for evaluation in evaluations:
        assert_complete(evaluation, HYBRID_RUBRIC)
        # The model judged its criterion, by the JSON schema: this server ignores tools.
        assert evaluation["verdict_mode"] == "json_schema"
    assert evaluations[0]["result"] == "needs_revision" and len(evaluations) == 2
    graders = [c for c in calls if c["role"] == "grader"]
    assert graders and all(c["status"] == "ok" and c["output_tokens"] for c in graders)


def test_the_real_grader_calls_an_evidence_tool_when_forced(llama_url: str) -> None:
    """SmolLM2 never chooses a tool: with ``force_tools`` it calls it, then gives a verdict."""
    seen: list[str] = []

    @tool
    def count_syllables(word: Annotated[str, Field(max_length=40)]) -> str:
        """Count the syllables of one word of the poem."""
        seen.append(word)
        return f"{word!r}: {count_syllables_of(word)} syllable(s)"

    grader = resolve_model(MODEL_STRING, base_url=llama_url, max_tokens=400, **sampling())
    worker = resolve_model(MODEL_STRING, base_url=llama_url, max_tokens=48, **sampling())
    evaluations: list[RubricEvaluation] = []
    middleware = RubricMiddleware(model=grader, tools=[count_syllables], force_tools=True,
                                  max_iterations=1, on_evaluation=evaluations.append)
    agent = create_agent(model=worker, middleware=[middleware], checkpointer=InMemorySaver())
    rubric = "- The poem is about spring"
    agent.invoke({"messages": [HumanMessage(PROMPT)], "rubric": rubric},
                 {"configurable": {"thread_id": "t"}})
    assert len(seen) == 1 and isinstance(seen[0], str)
    (evaluation,) = evaluations
    assert_complete(evaluation, rubric)


def test_stop_mid_stream_and_resume_end_once_each(tmp_path: Path, llama_url: str) -> None:
    settings = RunSettings(prompt="Write a long story about spring.", rubric=RULES_RUBRIC,
                           worker_model=MODEL_STRING, grader_model="rules",
                           base_url=llama_url, max_iterations=1, worker_max_tokens=160)
    with Store(tmp_path / "db.sqlite3") as store:
        run = session.start(store, settings, models=real_models())
        seen: list[dict[str, Any]] = []
        streaming = threading.Event()

        def consume() -> None:
            for event in run:
                seen.append(event)
                if event["type"] == "worker_token":
                    streaming.set()

        consumer = threading.Thread(target=consume)
        consumer.start()
        assert streaming.wait(timeout=120), seen
        assert session.request_stop(run.run_id)
        consumer.join(timeout=120)
        assert not consumer.is_alive()
        assert [e["status"] for e in seen if e["type"] == "run_finished"] in ([], ["interrupted"])
        assert not any(e["type"] == "evaluation_finished" for e in seen)  # stopped mid-stream
        assert session.wait_until_inactive(run.run_id, timeout_s=10)
        stopped = store.get_run(run.run_id)
        assert stopped.status == "interrupted" and stopped.iterations == 0

        resumed = list(session.resume(store, run.run_id, models=real_models()))
        evaluations = store.evaluations(run.run_id)
        final = store.get_run(run.run_id)
    endings = [e for e in resumed if e["type"] == "run_finished"]
    assert len(endings) == 1 and endings[0]["status"] == "max_iterations_reached"
    assert [e["iteration"] for e in evaluations] == [0] and final.status == endings[0]["status"]


def test_an_experiment_runs_two_cells_at_once(tmp_path: Path, llama_url: str) -> None:
    dataset = parse_dataset("id,prompt\nspring,Write a haiku about spring.\n"
                            "rain,Write a haiku about rain.\n", name="haiku")
    config = ExperimentConfig(worker_model=MODEL_STRING, grader_model="rules",
                              rubric="- The poem has three lines", max_iterations=1,
                              base_url=llama_url, worker_max_tokens=48)
    with Store(tmp_path / "db.sqlite3") as store:
        exp = create_experiment(store, dataset, [config], models=real_models())
        events = list(run_experiment(store, exp.experiment_id, concurrency=2,
                                     models=real_models()))
        results = experiment_results(store, exp.experiment_id)
        spans = []
        for cell in results.cells:
            (call,) = [c for c in store.calls(cell.run_id) if c["role"] == "worker"]
            start = datetime.fromisoformat(call["started_at"])
            spans.append((start, start + timedelta(seconds=call["latency_s"])))
    assert events[-1]["type"] == "experiment_finished" and events[-1]["status"] == "finished"
    assert len(results.cells) == 2
    assert {c.status for c in results.cells} <= {"satisfied", "max_iterations_reached"}
    (a_start, a_end), (b_start, b_end) = spans
    assert a_start < b_end and b_start < a_end  # the server answered both at once


def test_a_regrade_in_the_lab_grades_every_answer_with_the_real_grader(
        tmp_path: Path, llama_url: str) -> None:
    answers = parse_answers(
        "id,request,answer\n"
        "a,Write a haiku about spring.,\"Spring rain on the hill\ngreen buds open\nbirds sing\"\n"
        "b,Write a haiku about spring.,Winter is cold.\n", name="two")
    rubric = "- The poem is about spring"
    config = GraderConfig(rubric=rubric, grader_model=MODEL_STRING, base_url=llama_url,
                          max_tokens=400)
    with Store(tmp_path / "db.sqlite3") as store:
        job = create_regrade(store, answers, [config])
        events = list(run_regrade(store, job.job_id, concurrency=2, models=real_models()))
        results = store.regrade_results(job.job_id)
    assert events[-1]["type"] == "regrade_finished"
    assert len(results) == 2
    for result in results:
        assert result.result in RESULTS, result.explanation
        assert [c["name"] for c in result.criteria] == parse_criteria(rubric)
        assert result.missing == [] and result.input_tokens and result.output_tokens


def test_the_sidebar_lists_the_servers_models(tmp_path: Path, llama_url: str) -> None:
    from streamlit.testing.v1 import AppTest
    from test_app import ROOT

    app = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    app.session_state["db_path"] = str(tmp_path / "db.sqlite3")
    app.session_state["base_url"] = llama_url
    app.run()
    assert not app.exception, app.exception
    for key in ("worker_model", "grader_model"):
        options = app.sidebar.selectbox(key=key).options
        assert any(MODEL_STRING in option for option in options), options


@pytest.mark.browser
def test_a_run_on_the_real_model_is_watched_to_its_end_in_chromium(
        tmp_path: Path, llama_url: str) -> None:
    from browser_support import app_in_browser, choose, shot, wait_idle
    from playwright.sync_api import expect

    db = tmp_path / "browser.sqlite3"
    with app_in_browser(db, log_name="streamlit-real-model.log", last_shot="real-model-last",
                        extra_env={"RUBRIC_STUDIO_BASE_URL": llama_url}) as page:
        page.get_by_role("heading", name="Author").wait_for()
        wait_idle(page)
        page.locator(".st-key-prompt textarea").fill(PROMPT)
        page.locator(".st-key-rubric_text textarea").fill(RULES_RUBRIC.replace("- ", ""))
        page.locator(".st-key-rubric_text textarea").blur()
        wait_idle(page)
        choose(page, "worker_model", MODEL_STRING)
        wait_idle(page)
        limits = page.get_by_text("Output limits")
        limits.click()
        limit = page.locator(".st-key-worker_max_tokens input")
        limit.fill("48")
        limit.press("Enter")
        wait_idle(page)
        page.get_by_role("link", name="Run").click()
        page.locator(".st-key-run_button button").click()
        page.get_by_text("Draft 1", exact=False).first.wait_for()
        final = page.locator(".st-key-final_status")
        final.wait_for(timeout=180_000)
        expect(final).to_contain_text(re.compile("satisfied|max_iterations_reached"),
                                      timeout=60_000)
        wait_idle(page)
        shot(page, "real-model-done")
        assert "Draft 2" in page.locator("body").inner_text()  # it revised, live
    with Store(db) as store:
        (run,) = store.list_runs()
        evaluations = store.evaluations(run.run_id)
    assert run.status in ENDINGS and run.settings.worker_model == MODEL_STRING
    assert run.settings.worker_max_tokens == 48
    assert [e["iteration"] for e in evaluations] == list(range(len(evaluations)))
    assert evaluations[0]["result"] == "needs_revision"
