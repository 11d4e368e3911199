"""The Experiments page's per-model and per-configuration limits: the form's values as
`run_experiment`'s ``per_model``, ``model_rates``, ``per_config`` and ``config_rates``
(`limits_from_state`), the Limits per model table's values kept by model, and the page run with
AppTest on the bundled dataset (the offline ``demo`` worker and ``rules`` grader) on the queue
engine: started from the form, resumed, and a refused limit shown as an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest
from test_app import navigation_routing as navigation_routing

from rubric_core import app_support as sup
from rubric_core.app_support import experimenting
from rubric_core.experiments import create_experiment
from rubric_core.experiments.scheduler import check_config_limits, check_limits, check_rates
from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

ROOT = Path(__file__).resolve().parents[1]
W = "openai-compatible:w"
ROWS = len(demo_dataset().rows)


def _texts(elements: Any) -> str:
    return "\n".join(str(e.value) for e in elements)


def _form(**values: Any) -> dict[str, Any]:
    """The form's state: two configurations, demo × rules and `W` × rules."""
    state = sup.form_defaults({})
    state["exp_config_count"] = 2
    state[sup.config_key(1, "worker")] = W
    state.update(values)
    return state


# ------------------------------------------------------------------------- limits_from_state


def test_zeros_and_unused_models_are_dropped_and_config_limits_go_by_index() -> None:
    state = _form(**{
        sup.MODEL_LIMITS_KEY: {"rules": {"limit": 3, "rate": 0}, "demo": {"limit": 0, "rate": 20},
                               W: {"limit": 0, "rate": 0}, "gone": {"limit": 5, "rate": 5}},
        sup.config_key(0, "rate"): 10, sup.config_key(1, "limit"): 2,
        # A box no longer shown (the form has two): never a limit.
        sup.config_key(2, "limit"): 7})
    configs = sup.configs_from_state(state)
    limits = sup.limits_from_state(state, configs)
    assert limits == {"per_model": {"rules": 3}, "model_rates": {"demo": (20, 60.0)},
                      "per_config": {1: 2}, "config_rates": {0: (10, 60.0)}}
    # What the library checks before it runs anything accepts them.
    check_limits(4, limits["per_model"])
    check_rates(None, model_rates=limits["model_rates"], configs=configs)
    check_config_limits(configs, limits["per_config"], limits["config_rates"])
    assert sup.limits_text(limits, configs) == (
        "model rules 3 cell(s) at once; model demo 20 started a minute; configuration 1 "
        f"(demo × rules) 10 started a minute; configuration 2 ({W} × rules) 2 cell(s) at once")


def test_nothing_set_is_no_limit() -> None:
    state = _form()
    limits = sup.limits_from_state(state, sup.configs_from_state(state))
    assert limits == dict.fromkeys(("per_model", "model_rates", "per_config", "config_rates"))
    assert sup.limits_text(limits, sup.configs_from_state(state)) == ""


def test_another_experiments_configurations_get_the_model_limits_only() -> None:
    state = _form(**{sup.MODEL_LIMITS_KEY: {"rules": {"limit": 3, "rate": 6},
                                            W: {"limit": 2, "rate": 0}},
                     sup.config_key(0, "limit"): 1, sup.config_key(1, "rate"): 30})
    form = sup.configs_from_state(state)
    one = [ExperimentConfig(worker_model="demo", grader_model="rules")]
    assert sup.limits_from_state(state, one) == {
        "per_model": {"rules": 3}, "model_rates": {"rules": (6, 60.0)},
        "per_config": None, "config_rates": None}
    # The same configurations in another order: index 0 is another configuration there.
    swapped = sup.limits_from_state(state, form[::-1])
    assert swapped["per_config"] is None and swapped["config_rates"] is None
    assert swapped["per_model"] == {"rules": 3, W: 2}
    # Only a label differs: not the form's configuration either.
    relabelled = [form[0], ExperimentConfig(**{**form[1].to_dict(), "label": "other"})]
    assert sup.limits_from_state(state, relabelled)["per_config"] is None
    assert sup.limits_from_state(state, form)["per_config"] == {0: 1}


def test_huge_values_are_cut_to_the_fields_most() -> None:
    state = _form(**{sup.MODEL_LIMITS_KEY: {"rules": {"limit": 10**9, "rate": 10**12}},
                     sup.config_key(0, "limit"): 10**6, sup.config_key(1, "rate"): 1e15,
                     sup.config_key(1, "limit"): 5.0})
    limits = sup.limits_from_state(state, sup.configs_from_state(state))
    assert limits["per_model"] == {"rules": sup.MAX_CONCURRENCY}
    assert limits["model_rates"] == {"rules": (sup.MAX_RATE_CELLS, 60.0)}
    assert limits["per_config"] == {0: sup.MAX_CONCURRENCY, 1: 5}
    assert limits["config_rates"] == {1: (sup.MAX_RATE_CELLS, 60.0)}
    check_limits(sup.MAX_CONCURRENCY, limits["per_model"])  # still what the library accepts


@pytest.mark.parametrize("bad", [-1, 2.5, "3", True, float("nan"), [1]])
def test_bad_values_are_refused_by_name(bad: Any) -> None:
    for values, name in (
            ({sup.MODEL_LIMITS_KEY: {"rules": {"limit": bad}}}, "Cells at once for model rules"),
            ({sup.MODEL_LIMITS_KEY: {W: {"rate": bad}}}, f"Cells started per minute for model {W}"),
            ({sup.config_key(1, "limit"): bad}, "Cells at once of configuration 2"),
            ({sup.config_key(0, "rate"): bad}, "Cells started per minute of configuration 1")):
        state = _form(**values)
        with pytest.raises(ValueError, match=f"^{name} must be a whole number of cells from 0"):
            sup.limits_from_state(state, sup.configs_from_state(state))


def test_the_table_keeps_its_values_by_model() -> None:
    state = _form()
    models = sup.form_models(sup.configs_from_state(state))
    assert models == ["demo", "rules", W]
    frame = sup.model_limits_frame(state, models)
    assert list(frame.columns) == list(sup.MODEL_LIMIT_COLUMNS)
    assert frame["Model"].tolist() == models
    assert frame["Cells at once"].tolist() == [0, 0, 0]
    key = sup.model_limits_editor_key(models)
    state[key] = {"edited_rows": {2: {"Cells at once": 4}, 1: {"Cells started per minute": 30}},
                  "added_rows": [], "deleted_rows": []}
    sup.keep_model_limit_edits(state, key, models)
    # A later edit: the earlier ones come again with it (the editor keeps them all).
    state[key]["edited_rows"][0] = {"Cells at once": None}  # a cleared cell: no limit
    state[key]["edited_rows"][1]["Cells at once"] = 10**9
    sup.keep_model_limit_edits(state, key, models)
    assert state[sup.MODEL_LIMITS_KEY] == {"demo": {"limit": 0, "rate": 0},
                                           "rules": {"limit": sup.MAX_CONCURRENCY, "rate": 30},
                                           W: {"limit": 4, "rate": 0}}
    # One configuration left: W is not on the table, and its value is kept for later.
    state["exp_config_count"] = 1
    fewer = sup.form_models(sup.configs_from_state(state))
    assert fewer == ["demo", "rules"] and sup.model_limits_editor_key(fewer) != key
    assert sup.model_limits_frame(state, fewer)["Cells at once"].tolist() == [
        0, sup.MAX_CONCURRENCY]
    assert sup.limits_from_state(state, sup.configs_from_state(state))["per_model"] == {
        "rules": sup.MAX_CONCURRENCY}
    state["exp_config_count"] = 2
    again = sup.model_limits_frame(state, models)
    assert again.set_index("Model")["Cells at once"].to_dict() == {
        "demo": 0, "rules": sup.MAX_CONCURRENCY, W: 4}


# ------------------------------------------------------------------------- the page (AppTest)




@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of every `run_experiment` call the page makes; the real one runs."""
    seen: list[dict[str, Any]] = []
    real = experimenting.run_experiment

    def recording(store: Any, experiment_id: str, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return real(store, experiment_id, **kwargs)

    monkeypatch.setattr(experimenting, "run_experiment", recording)
    return seen


def _page(db: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    """The Experiments page with the bundled dataset stored and two configurations (demo ×
    rules, the second labelled "B")."""
    monkeypatch.setenv(sup.TOKEN_DELAY_ENV, "0")
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db)
    at.run()
    at.switch_page("pages/experiments.py").run()
    assert not at.exception, at.exception
    at.button(key="load_demo_dataset").click().run()
    at.number_input(key="exp_config_count").set_value(2).run()
    at.text_input(key=sup.config_key(1, "label")).set_value("B").run()
    assert not at.exception, at.exception
    return at


def _most_at_once(cells: list[Any]) -> int:
    """The most of these cells' runs that were running at one time (created → last update)."""
    edges = sorted([(c.run.created_at, 1) for c in cells] + [(c.run.updated_at, -1) for c in cells],
                   key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_limits_set_on_the_form_reach_the_run_and_it_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]) -> None:
    db = tmp_path / "app.sqlite3"
    at = _page(db, monkeypatch)
    # The boxes' fields, as typed.
    at.number_input(key=sup.config_key(0, "limit")).set_value(1).run()
    at.number_input(key=sup.config_key(1, "rate")).set_value(600).run()
    assert [e.label for e in at.expander if e.label == "Limits per model"]
    assert ("the limits in a configuration's box apply only to an experiment started from "
            "this form") in _texts(at.caption)
    # The table's values, as its callback keeps them (AppTest cannot type into a data editor).
    at.session_state[sup.MODEL_LIMITS_KEY] = {"rules": {"limit": 2, "rate": 1000},
                                              "gone": {"limit": 1, "rate": 1}}
    at.run()
    button = at.button(key="exp_start")
    assert not button.disabled
    button.click().run()
    assert not at.exception, at.exception
    assert not at.error, _texts(at.error)
    assert "Experiment finished" in _texts(at.success)
    assert len(calls) == 1
    assert {k: getattr(calls[0]["limits"], k)
            for k in ("per_model", "model_rates", "per_config", "config_rates")
            } == {"per_model": {"rules": 2}, "model_rates": {"rules": (1000, 60.0)},
                  "per_config": {0: 1}, "config_rates": {1: (600, 60.0)}}
    with Store(db) as store:
        (experiment,) = store.list_experiments()
        cells = store.experiment_cells(experiment.experiment_id)
    assert len(cells) == 2 * ROWS
    assert {c.status for c in cells} == {"satisfied"}
    # The runs' times agree: configuration 1 one cell at a time, the experiment at most two
    # at once (every cell uses the rules grader).
    assert _most_at_once([c for c in cells if c.config_index == 0]) == 1
    assert _most_at_once(cells) <= 2
    assert f"finished · {2 * ROWS}/{2 * ROWS} cells ended" in _texts(at.caption)


def test_a_resume_gets_the_model_limits_and_no_configuration_limits_of_another_form(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]) -> None:
    db = tmp_path / "app.sqlite3"
    at = _page(db, monkeypatch)
    with Store(db) as store:  # an experiment of one configuration, not this form's two
        record = create_experiment(store, "bundled-demo",
                                   [ExperimentConfig(worker_model="demo", grader_model="rules")])
    at.session_state["exp_pick"] = record.experiment_id
    at.session_state[sup.config_key(0, "limit")] = 1
    at.session_state[sup.MODEL_LIMITS_KEY] = {"rules": {"limit": 3, "rate": 0},
                                              W: {"limit": 2, "rate": 5}}
    at.run()
    assert not at.exception, at.exception
    assert " · limits: model rules 3 cell(s) at once" in _texts(at.caption)  # Resume's
    at.button(key="exp_resume").click().run()
    assert not at.exception, at.exception
    assert not at.error, _texts(at.error)
    assert "Experiment finished" in _texts(at.success)
    assert len(calls) == 1
    limits = calls[0]["limits"]
    assert limits.per_model == {"rules": 3}
    assert not limits.model_rates
    assert not limits.per_config and not limits.config_rates
    with Store(db) as store:
        assert {c.status for c in store.experiment_cells(record.experiment_id)} == {"satisfied"}


def test_a_refused_limit_is_an_error_and_nothing_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]) -> None:
    db = tmp_path / "app.sqlite3"
    at = _page(db, monkeypatch)
    at.session_state[sup.MODEL_LIMITS_KEY] = {"rules": {"limit": -2, "rate": 0}}
    at.run()
    refusal = (f"Cells at once for model rules must be a whole number of cells from 0 (no "
               f"limit) to {sup.MAX_CONCURRENCY}, got -2")
    assert f"Limits: {refusal}." in _texts(at.error)
    assert at.button(key="exp_start").disabled  # no experiment is created to sit unrun
    with Store(db) as store:
        assert store.list_experiments() == []
        record = create_experiment(store, "bundled-demo", [ExperimentConfig()])
    at.session_state["exp_pick"] = record.experiment_id
    at.run()
    assert f" · limits refused: {refusal}" in _texts(at.caption)
    at.button(key="exp_resume").click().run()  # Resume: the refusal is the page's error
    assert not at.exception, at.exception
    assert refusal in _texts(at.error)
    assert calls == []
    with Store(db) as store:
        assert all(c.run is None for c in store.experiment_cells(record.experiment_id))


# ------------------------------------------------------------------------- the page (Chromium)


def _grid_cell(editor: Any, column: int, row: int) -> tuple[float, float]:
    """Where to click a data editor's cell: its canvas draws the cells (a 35 px header and
    rows); the accessible table behind it has no boxes. Columns here: Model 0, then 1 and 2."""
    box = editor.locator("canvas").first.bounding_box()
    x = box["x"] + box["width"] * (0.1, 0.4, 0.8)[column]
    return x, box["y"] + 35 * (row + 1) + 17


@pytest.mark.browser
def test_limits_typed_in_the_browser_are_kept_and_run(tmp_path: Path) -> None:
    from browser_support import (
        app_in_browser,
        open_experiments_with_the_demo_dataset,
        shot,
        wait_idle,
    )
    from playwright.sync_api import expect

    db = tmp_path / "browser.sqlite3"
    with app_in_browser(db, log_name="streamlit-limits.log", last_shot="27-limits-last") as page:
        page.get_by_role("heading", name="Author").wait_for()
        wait_idle(page)
        page.get_by_text("Pace the offline demo").click()  # the cells run at full speed
        wait_idle(page)
        open_experiments_with_the_demo_dataset(page)

        def type_number(key: str, value: int) -> None:
            field = page.locator(f".st-key-{key} input")
            field.fill(str(value))
            field.press("Enter")
            wait_idle(page)
            expect(field).to_have_value(str(value))

        def set_configurations(count: int) -> None:
            # Waits for the page drawn with that many boxes: typing again before it is drawn
            # lost the new count once (the rerun of the one before drew its own over it).
            type_number("exp_config_count", count)
            expect(page.get_by_text(f"Configuration {count}", exact=True)).to_be_visible()
            expect(page.get_by_text(f"Configuration {count + 1}", exact=True)).to_have_count(0)

        set_configurations(2)
        type_number(sup.config_key(0, "limit"), 1)
        page.get_by_text("Limits per model").click()
        wait_idle(page)
        editor = page.locator(f".st-key-{sup.model_limits_editor_key(['demo', 'rules'])}")
        cells_at_once = editor.locator("#glide-cell-1-1")  # rules, Cells at once
        expect(cells_at_once).to_have_text("0")
        page.mouse.click(*_grid_cell(editor, 1, 1))
        expect(cells_at_once).to_have_attribute("aria-selected", "true")
        page.keyboard.type("3")  # a selected cell opens its editor with what is typed
        expect(page.locator("#portal input").first).to_have_value("3")
        page.keyboard.press("Enter")
        wait_idle(page)
        expect(cells_at_once).to_have_text("3")
        limits = ("Limits: model rules 3 cell(s) at once; configuration 1 (demo × rules) "
                  "1 cell(s) at once.")
        page.get_by_text(limits).wait_for()
        # One configuration and back: the table is drawn again from the values kept by model.
        set_configurations(1)
        set_configurations(2)
        expect(cells_at_once).to_have_text("3")
        page.get_by_text(limits).wait_for()
        page.get_by_text("Limits per model").scroll_into_view_if_needed()
        shot(page, "27-limits-form")
        page.locator(".st-key-exp_start button").click()
        page.get_by_text("Experiment finished").wait_for()
        wait_idle(page)
    with Store(db) as store:
        (experiment,) = store.list_experiments()
        cells = store.experiment_cells(experiment.experiment_id)
    assert len(cells) == 2 * ROWS
    assert {c.status for c in cells} == {"satisfied"}
    assert _most_at_once([c for c in cells if c.config_index == 0]) == 1
    assert _most_at_once(cells) <= 3
