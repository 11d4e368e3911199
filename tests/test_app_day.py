"""A person's day with the app (issue #24), driven with AppTest: titles, Resume, Stop, drafts."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from openai_server import FakeOpenAI, text, verdict
from streamlit.testing.v1 import AppTest
from test_app import ROOT, _messages, _texts, goto, load_example, run_loop, start_bundled_experiment
from test_app import app as app  # the fixtures test_app.py defines
from test_app import db_path as db_path
from test_app import navigation_routing as navigation_routing

from rubric_core import app_support as sup
from rubric_core.examples import get_example
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def param(at: AppTest, name: str) -> str:
    """A URL query parameter of the page as the app last set it."""
    value = at.query_params.get(name, "")
    return value[-1] if isinstance(value, list) else str(value)


def new_app(db_path: Path, query: dict[str, str] | None = None, **state: object) -> AppTest:
    """A new browser session on ``db_path`` with typed values (as the browser sends them)."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db_path)
    for name, value in (query or {}).items():
        at.query_params[name] = value
    for name, value in state.items():
        at.session_state[name] = value
    at.run()
    assert not at.exception, at.exception
    return at


def test_a_prompt_edited_away_from_an_example_is_the_users_own_run(
    app: AppTest, db_path: Path
) -> None:
    # Issue 24.1: every run after loading an example was titled after it, and the example's
    # hidden worker system prompt went with unrelated prompts.
    load_example(app, "haiku")
    assert get_example("haiku").worker_system_prompt
    app.text_area(key="prompt").input("Write a limerick about a programmer.").run()
    assert "no longer the example" in _texts(app.info)
    assert app.text_area(key="worker_system_prompt").value == ""
    store = run_loop(app)
    run = store.get_run(app.session_state["last_run_id"])
    assert run.title == "Write a limerick about a programmer."
    assert run.settings.worker_system_prompt == "" and run.settings.example_name is None
    goto(app, "review")
    app.text_input(key="filter_text").input("limerick").run()
    assert "Haiku about spring" not in str(app.dataframe[0].value)


def test_an_unchanged_example_keeps_its_title_and_a_set_system_prompt_is_shown(
    app: AppTest,
) -> None:
    load_example(app, "haiku")
    assert "set: sent with the run" in next(e.label for e in app.expander)
    store = run_loop(app)
    assert store.get_run(app.session_state["last_run_id"]).title == get_example("haiku").title
    assert "no longer the example" not in _messages(app)


def test_resume_moves_a_run_from_a_dead_port_to_a_live_server(db_path: Path) -> None:
    # Issue 24.2: a run sent to a dead port said "fix the base URL and press Resume", but
    # Resume reused the dead URL, so the run could never be finished.
    key = "sk-typed-for-resume-never-stored"
    app = new_app(db_path, base_url="http://127.0.0.1:9/v1", worker_model="openai-compatible:w",
                  grader_model="openai-compatible:g", prompt="write it", rubric_text="- c1\n- c2")
    store = run_loop(app)
    run_id = app.session_state["last_run_id"]
    assert store.get_run(run_id).status == "error"
    assert "Resume with another endpoint or models" in _texts(app.markdown)
    names = sup.resume_widget_keys(run_id)
    assert app.text_input(key=names["base_url"]).value == "http://127.0.0.1:9/v1"
    with FakeOpenAI() as server:
        server.enqueue(text("a draft"), verdict("satisfied"))
        app.text_input(key=names["base_url"]).input(server.base_url).run()
        app.text_input(key=names["grader_model"]).input("openai-compatible:judge").run()
        app.text_input(key=names["api_key"]).input(key).run()
        app.button(key="resume_button").click().run()
        assert not app.exception, app.exception
        assert "Final status: satisfied" in _texts(app.success)
        assert f"base URL {server.base_url}" in _texts(app.info)
        assert [r["model"] for r in server.requests] == ["w", "judge"]
    with Store(db_path) as s:
        run = s.get_run(run_id)
    assert run.status == "satisfied" and run.settings.base_url == server.base_url
    assert run.grader_model == "openai-compatible:judge"
    for file in db_path.parent.glob(db_path.name + "*"):
        assert key.encode() not in file.read_bytes()


def test_a_reload_restores_the_draft_and_never_a_key(db_path: Path) -> None:
    # Issue 24.3: a reload lost the prompt, the rubric and the sidebar, silently.
    key = "sk-typed-in-the-sidebar-never-in-a-draft"
    first = new_app(db_path)
    first.text_area(key="prompt").input("Write a limerick about a cat.").run()
    first.text_area(key="rubric_text").input("- The poem has five lines").run()
    first.sidebar.number_input(key="max_iterations").set_value(5).run()
    first.sidebar.text_input(key="base_url").input("http://127.0.0.1:9/v1").run()
    first.sidebar.text_input(key="session_api_key").input(key).run()
    draft_id = param(first, "draft")
    assert len(draft_id) == 32

    reloaded = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    reloaded.session_state["db_path"] = str(db_path)
    reloaded.query_params["draft"] = draft_id
    reloaded.run()
    assert not reloaded.exception
    assert reloaded.text_area(key="prompt").value == "Write a limerick about a cat."
    assert reloaded.text_area(key="rubric_text").value == "- The poem has five lines"
    assert reloaded.sidebar.number_input(key="max_iterations").value == 5
    assert reloaded.sidebar.text_input(key="base_url").value == "http://127.0.0.1:9/v1"
    assert not reloaded.sidebar.text_input(key="session_api_key").value
    assert "Restored what you had typed" in _texts(reloaded.toast)
    # The restored draft goes on under a new id: two tabs never write one draft.
    assert param(reloaded, "draft") not in ("", draft_id)
    for file in db_path.parent.glob(db_path.name + "*"):
        assert key.encode() not in file.read_bytes()


def test_a_reload_restores_the_experiments_budget_and_a_page_switch_keeps_it(
        db_path: Path) -> None:
    # Issue 25: the budget (max cost) typed on the Experiments page was lost on a reload.
    first = new_app(db_path)
    goto(first, "experiments")
    first.button(key="load_demo_dataset").click().run()
    first.number_input(key="exp_budget").set_value(2.5).run()
    assert "budget $2.50" in _texts(first.caption), _texts(first.caption)
    goto(first, "run")  # drawn elsewhere, the field keeps its value
    goto(first, "experiments")
    assert first.number_input(key="exp_budget").value == 2.5
    draft_id = param(first, "draft")
    with Store(db_path) as store:
        assert (store.load_draft(draft_id) or {})["exp_budget"] == 2.5

    reloaded = new_app(db_path, {"draft": draft_id})
    assert "Restored what you had typed" in _texts(reloaded.toast)
    goto(reloaded, "experiments")
    assert not reloaded.exception, reloaded.exception
    assert reloaded.number_input(key="exp_budget").value == 2.5
    assert "budget $2.50" in _texts(reloaded.caption), _texts(reloaded.caption)


def test_run_and_experiment_links_open_them(app: AppTest, db_path: Path) -> None:
    load_example(app, "haiku")
    run_loop(app)
    run_id = app.session_state["last_run_id"]
    load_example(app, "photosynthesis")
    run_loop(app)
    goto(app, "review")
    assert param(app, "run") != run_id  # the newer run is open; the URL says so

    linked = new_app(db_path, query={"run": run_id})
    assert linked.selectbox(key="review_run").value == run_id
    assert f"?run={run_id}" in _texts(linked.caption) or f"?run={run_id}" in _texts(
        linked.markdown)
    bad = new_app(db_path, query={"run": "0" * 32})  # no such run: the history opens
    assert bad.selectbox(key="review_run").value != "0" * 32


def test_review_lists_single_runs_apart_from_experiment_cells(app: AppTest) -> None:
    # Issue 24.7: 101 runs after two small experiments, the person's own on page 3.
    load_example(app, "haiku")
    run_loop(app)
    mine = app.session_state["last_run_id"]
    start_bundled_experiment(app)
    goto(app, "review")
    assert "1 run(s) match" in _texts(app.caption)
    assert app.selectbox(key="review_run").value == mine
    app.session_state["filter_origin"] = "experiment"
    app.run()
    assert "24 run(s) match" in _texts(app.caption)
    app.session_state["filter_origin"] = "all"
    app.run()
    assert "25 run(s) match" in _texts(app.caption)


def test_the_sidebar_offers_the_models_a_local_server_lists(db_path: Path) -> None:
    # Issue 24.5: model names had to be typed although the server lists them at /v1/models.
    with FakeOpenAI() as server:
        server.models = ["llama3.1:8b", "qwen2.5"]
        app = new_app(db_path, base_url=server.base_url)
        options = app.sidebar.selectbox(key="worker_model").options
        assert any("openai-compatible:qwen2.5" in o for o in options)
        assert "2 model(s) offered by this server" in _texts(app.sidebar.caption)
        # An empty base URL reads as empty, not as a grey value.
        assert app.sidebar.text_input(key="base_url").placeholder.startswith("empty:")
        assert server.models_auth == [None]  # no key typed for it: none sent
        app.sidebar.text_input(key="session_api_key").input("sk-typed-for-it").run()
        app.session_state["_server_models"] = None  # ask again now
        app.run()
        assert server.models_auth[-1] == "Bearer sk-typed-for-it"
    dead = new_app(db_path, base_url="http://127.0.0.1:9/v1")
    assert "No model list from this base URL" in _texts(dead.sidebar.caption)


def test_a_hybrid_verdict_says_per_criterion_whether_the_rule_or_the_model_decided(
    db_path: Path,
) -> None:
    # Issue 24.6: "3/3 pass" from the model next to needs_revision, with no word of the rule
    # that overrode it.
    criteria = ("Mentions spring", "The tone is playful")
    with FakeOpenAI() as server:
        server.enqueue(text("A cat sat on a mat."), verdict("satisfied", criteria=criteria),
                       text("Spring came."), verdict("satisfied", criteria=criteria))
        app = new_app(db_path, base_url=server.base_url, worker_model="openai-compatible:w",
                      grader_model="hybrid:openai-compatible:g", prompt="write it",
                      rubric_text="- Mentions spring\n- The tone is playful")
        run_loop(app)
    notes = "\n".join(str(d.value) for d in app.dataframe)
    assert "decided by the rule (the model said pass)" in notes
    assert "decided by the model" in notes
    goto(app, "review")
    table = next(d.value for d in app.dataframe if "pass" in d.value.columns)
    assert table["note"].str.contains("the model said pass").any()


def test_the_offline_demo_is_paced_so_a_run_can_be_followed(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 24.8: the bundled examples finished in 0.4 s, so a newcomer never saw a run live.
    monkeypatch.delenv(sup.TOKEN_DELAY_ENV, raising=False)
    app = new_app(db_path)
    assert app.sidebar.checkbox(key="pace_demo").value is True
    load_example(app, "haiku")
    store = run_loop(app)
    paced = store.get_run(app.session_state["last_run_id"])
    assert paced.status == "satisfied" and paced.iterations == 2
    assert paced.duration_s >= 2 * sup.PACED_GRADER_PAUSE_S  # each verdict took a second
    app.sidebar.checkbox(key="pace_demo").uncheck().run()
    run_loop(app)
    unpaced = store.get_run(app.session_state["last_run_id"])
    assert unpaced.duration_s < paced.duration_s


def test_pacing_is_for_the_offline_models_and_an_explicit_delay_wins() -> None:
    assert sup.demo_pacing(None, True) == (sup.PACED_TOKEN_DELAY_S, sup.PACED_GRADER_PAUSE_S)
    assert sup.demo_pacing(None, False) == (sup.DEFAULT_TOKEN_DELAY_S, 0.0)
    assert sup.demo_pacing("0", True) == (0.0, 0.0)  # tests and operators set it
    assert sup.demo_pacing(None, True, override=0) == (0.0, 0.0)


def test_the_experiment_viewer_filters_disagreements_and_shows_a_row_side_by_side(
    app: AppTest,
) -> None:
    # Issue 24: a promptfoo-like viewer: coloured statuses, the answer readable in place,
    # rows where configurations disagree, two configurations' answers side by side.
    goto(app, "experiments")
    app.session_state[sup.config_key(1, "cap")] = 1
    app.session_state[sup.config_key(1, "label")] = "one pass"
    exp_id = start_bundled_experiment(app, configs=2)
    grid = next(d for d in app.dataframe if "1. demo × rules" in d.value.columns)
    assert len(grid.value) == 24
    app.toggle(key=f"exp_disagree_{exp_id}").set_value(True).run()
    shown = next(d for d in app.dataframe if "1. demo × rules" in d.value.columns).value
    assert len(shown) == 24  # one pass is never enough for the demo: every row disagrees
    assert shown["1. demo × rules"].str.startswith("satisfied").all()
    assert not shown["2. one pass"].str.startswith("satisfied").any()
    app.session_state[f"exp_grid_{exp_id}_True"] = {
        "selection": {"rows": [], "columns": [], "cells": [[0, "1. demo × rules"]]}}
    app.run()
    assert not app.exception, app.exception
    assert f"row {shown['row'][0]}" in _texts(app.markdown)
    assert app.selectbox(key=f"exp_beside_{exp_id}").value == "2. one pass"
    both = [str(m.value) for m in app.markdown]
    assert any("**1. demo × rules**" in t for t in both)
    assert any("**2. one pass**" in t for t in both)
    verdicts = [d.value for d in app.dataframe if "gap" in d.value.columns]
    assert len(verdicts) == 2 and verdicts[1]["passed"].eq(False).any()


def test_only_rows_whose_configurations_ended_differently_are_disagreements() -> None:
    table = pd.DataFrame({"row": ["a", "b", "c", "d"],
                          "1. x": ["satisfied · 1 pass", "satisfied · 2 passes", "failed",
                                   "satisfied · 1 pass"],
                          "2. y": ["satisfied · 3 passes", "max_iterations_reached · 1 pass",
                                   "error", None]})
    grid = sup.ResultsGrid(table, table.copy())
    assert sup.disagreements(grid).tolist() == [False, True, False, False]
    shown = sup.shown_grid(grid, only_disagreements=True)
    assert shown.table["row"].tolist() == ["b"] and shown.run_ids["row"].tolist() == ["b"]


def test_grid_cells_are_coloured_by_status() -> None:
    assert "#d3f9d8" in sup.status_css("satisfied · 2 passes · 0.1 s")
    assert "#ffe3e3" in sup.status_css("failed · 1 pass")
    assert sup.status_css("pending") == "" and sup.status_css(None) == ""
