"""Unit tests of the app's logic, without Streamlit."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rubric_core import app_support as sup
from rubric_core import session
from rubric_core.app_support.judging import CHART_LABEL_LIMIT_PX, CHART_ROW_PX
from rubric_core.examples import get_example, list_examples
from rubric_core.export import EXPORT_COLUMNS
from rubric_core.settings import RunSettings
from rubric_core.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "db.sqlite3") as s:
        yield s


def _ev(iteration: int, answer: str, verdicts: dict[str, bool], gid: str = "g1") -> dict:
    criteria = [
        {"name": n, "passed": p, **({} if p else {"gap": f"fix {n}"})} for n, p in verdicts.items()
    ]
    failing = [c for c in criteria if not c["passed"]]
    result = "needs_revision" if failing else "satisfied"
    return {
        "grading_run_id": gid, "iteration": iteration, "result": result,
        "explanation": "why", "criteria": criteria, "status": result, "unverified": False,
        "duration_s": 0.5, "input_tokens": 10, "output_tokens": 5, "answer": answer,
    }


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("session", "secrets", "expected"),
    [
        pytest.param("/a/db.sqlite3", {"db_path": "/b"}, Path("/a/db.sqlite3"), id="session_wins"),
        pytest.param(None, {"db_path": "/b/x.sqlite3"}, Path("/b/x.sqlite3"), id="then_secrets"),
        pytest.param("  ", {}, None, id="blank_is_default"),
    ],
)
def test_resolve_db_path(session: Any, secrets: dict, expected: Path | None,
                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RUBRIC_STUDIO_DB", str(tmp_path / "env.sqlite3"))
    got = sup.resolve_db_path(session, secrets)
    assert got == (expected or tmp_path / "env.sqlite3")


def test_safe_mapping_swallows_loading_errors() -> None:
    class Broken:
        def __iter__(self) -> Any:
            msg = "no secrets.toml"
            raise FileNotFoundError(msg)

    assert sup.safe_mapping(Broken()) == {}
    assert sup.safe_mapping({"a": 1}) == {"a": 1}


@pytest.mark.parametrize(
    ("env", "override", "expected"),
    [
        pytest.param(None, None, sup.DEFAULT_TOKEN_DELAY_S, id="default"),
        pytest.param("0", None, 0.0, id="env_zero"),
        pytest.param("0.2", 0, 0.0, id="override_wins"),
        pytest.param("nonsense", None, sup.DEFAULT_TOKEN_DELAY_S, id="bad_env_ignored"),
        pytest.param("-1", None, sup.DEFAULT_TOKEN_DELAY_S, id="negative_ignored"),
    ],
)
def test_token_delay(env: str | None, override: Any, expected: float) -> None:
    assert sup.token_delay(env, override) == expected


@pytest.mark.parametrize(
    ("value", "expected", "has_message"),
    [
        pytest.param(3, 3, False, id="in_range"),
        pytest.param(0, 1, True, id="too_low"),
        pytest.param(51, 50, True, id="too_high"),
        pytest.param(2.5, 3, True, id="fraction_reset_to_default"),
        pytest.param(True, 3, True, id="bool_rejected"),
        pytest.param("7", 3, True, id="string_rejected"),
    ],
)
def test_check_max_iterations(value: Any, expected: int, has_message: bool) -> None:
    got, message = sup.check_max_iterations(value)
    assert got == expected
    assert (message is not None) == has_message


def test_model_options_show_unavailable_with_reason() -> None:
    choices = sup.model_options("worker", env={}, secrets={})
    assert choices[0] == sup.ModelChoice("demo")
    openai = next(c for c in choices if c.value == "openai:gpt-4.1-mini")
    assert openai.reason and "OPENAI_API_KEY" in openai.reason
    assert "unavailable" in sup.model_label(choices, "openai:gpt-4.1-mini")
    compat = next(c for c in choices if c.value.startswith("openai-compatible:"))
    assert compat.reason and "base URL" in compat.reason


def test_model_options_key_from_secrets_and_base_url() -> None:
    choices = sup.model_options("grader", env={}, secrets={"OPENAI_API_KEY": "sk-test"},
                                base_url="http://127.0.0.1:1/v1", current="x:y")
    by_value = {c.value: c for c in choices}
    assert by_value["rules"].reason is None
    assert by_value["openai:gpt-4.1-mini"].reason is None
    assert by_value["hybrid:openai:gpt-4.1-mini"].reason is None
    assert by_value["openai-compatible:llama3.1"].reason is None
    assert "x:y" in by_value


def test_api_key_for_reads_only_the_providers_key() -> None:
    secrets = {"OPENAI_API_KEY": "sk-o", "ANTHROPIC_API_KEY": "sk-a"}
    assert sup.api_key_for("openai:gpt-4.1-mini", secrets) == "sk-o"
    assert sup.api_key_for("hybrid:anthropic:claude", secrets) == "sk-a"
    assert sup.api_key_for("demo", secrets) is None


def test_model_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    assert sup.model_problem("demo", base_url=None, secrets={}) is None
    assert "OPENAI_API_KEY" in (sup.model_problem("openai:gpt-4.1-mini", base_url=None,
                                                  secrets={}) or "")
    assert "provider:model" in (sup.model_problem("nonsense", base_url=None, secrets={}) or "")


# --------------------------------------------------------------------------- authoring


def test_load_example_into_fills_the_form() -> None:
    state: dict[str, Any] = {"example_select": "find_duplicates"}
    sup.load_example_into(state)
    example = get_example("find_duplicates")
    assert state["prompt"] == example.prompt
    assert state["rubric_text"] == example.rubric
    assert state["grader_tools"] == [t.name for t in example.grader_tools()]
    assert state["example_name"] == "find_duplicates"
    assert state["max_iterations"] == example.max_iterations


def test_tool_options_and_build_tools() -> None:
    options = sup.tool_options("json_product", ["extra"])
    assert set(sup.default_tool_names()) <= set(options)
    assert "check_product_schema" in options and options[-1] == "extra"
    tools = sup.build_tools(["check_product_schema"], "json_product")
    assert [t.name for t in tools] == ["check_product_schema"]
    with pytest.raises(ValueError, match="not available"):
        sup.build_tools(["check_product_schema"], None)


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        pytest.param({"edited_rows": {"1": {"criterion": "B2"}}}, ["A", "B2", "C"], id="edit"),
        pytest.param({"added_rows": [{"criterion": "D"}, {}]}, ["A", "B", "C", "D"], id="add"),
        pytest.param({"deleted_rows": [0, 2]}, ["B"], id="delete"),
        pytest.param({"edited_rows": {0: {"criterion": "  "}}}, ["B", "C"], id="blank_dropped"),
        pytest.param({}, ["A", "B", "C"], id="no_edits"),
    ],
)
def test_apply_editor_edits(edits: dict, expected: list[str]) -> None:
    assert sup.apply_editor_edits(["A", "B", "C"], edits) == expected


def test_sync_rubric_from_editor_rewrites_text() -> None:
    rubric = "1. The poem has three lines\n2. The theme is spring"
    key = sup.editor_key(rubric)
    state: dict[str, Any] = {key: {"edited_rows": {1: {"criterion": "The theme is autumn"}},
                                   "added_rows": [], "deleted_rows": []}}
    sup.sync_rubric_from_editor(state, key, rubric)
    assert state["rubric_text"] == "- The poem has three lines\n- The theme is autumn"
    assert sup.editor_key(state["rubric_text"]) != key
    assert list(sup.criteria_frame(rubric)["criterion"]) == [
        "The poem has three lines", "The theme is spring"]


def test_lint_for_ui_levels() -> None:
    assert sup.lint_for_ui("  ", "rules")[0].level == "error"
    dup = sup.lint_for_ui("- The poem has three lines\n- the poem has three lines", "rules")
    assert any(m.level == "error" and "Duplicate" in m.text for m in dup)
    unknown = sup.lint_for_ui("- The tone is warm and inviting", "rules")
    assert any(m.level == "warning" and "rules grader cannot check" in m.text for m in unknown)
    assert not any("rules grader" in m.text
                   for m in sup.lint_for_ui("- The tone is warm", "openai:gpt-4.1-mini"))
    assert sup.lint_for_ui(get_example("haiku").rubric, "rules") == []
    long = "\n".join(f"- The answer mentions term{i}" for i in range(45))
    assert any("criteria" in m.text and m.level == "warning" for m in sup.lint_for_ui(long, "x"))


# --------------------------------------------------------------------------- running


def _form(**changes: Any) -> RunSettings:
    example = get_example("haiku")
    return RunSettings(prompt=example.prompt, rubric=example.rubric, example_name="haiku",
                       worker_system_prompt=example.worker_system_prompt).replace(**changes)


def test_settings_from_state_defaults() -> None:
    form = sup.settings_from_state({"prompt": "p", "rubric_text": "- r", "grader_tools": ["t"]})
    assert (form.prompt, form.rubric, form.worker_model, form.grader_model) == (
        "p", "- r", "demo", "rules")
    assert form.grader_tools == ("t",) and form.max_iterations == 3 and form.base_url is None
    assert sup.session_key({"session_api_key": " sk-typed "}) == "sk-typed"
    assert sup.session_key({}) is None


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        pytest.param({"prompt": " "}, "prompt is empty", id="empty_prompt"),
        pytest.param({"rubric": ""}, "rubric is empty", id="empty_rubric"),
        pytest.param({"max_iterations": 0}, "outside", id="iterations_too_low"),
        pytest.param({"max_iterations": 99}, "outside", id="iterations_too_high"),
        pytest.param({"worker_model": "nosuch"}, "Worker model", id="bad_model_string"),
        pytest.param({"grader_tools": ("ghost",)}, "ghost", id="unknown_tool"),
    ],
)
def test_check_form_errors(changes: dict, needle: str) -> None:
    messages = sup.check_form(_form(**changes), secrets={})
    assert any(m.level == "error" and needle in m.text for m in messages), messages


def test_check_form_clean_and_spec() -> None:
    form = _form()
    assert sup.check_form(form, secrets={}) == []
    spec = session.build_spec(form, sup.app_models({}, session_key=None, sidebar_base_url=None,
                                                   token_delay_s=0))
    assert spec.max_iterations == 3 and spec.worker_system_prompt


def test_app_models_keep_keys_to_their_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-" + "x" * 20)
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    typed = "sk-typed-" + "y" * 20
    models = sup.app_models({}, session_key=typed, sidebar_base_url="http://h:1/v1",
                            token_delay_s=0)

    def key(base_url: str | None) -> str | None:
        model = models("openai-compatible:m", "worker", base_url)
        secret = model.openai_api_key  # type: ignore[attr-defined]
        return secret.get_secret_value() if secret is not None else None

    assert key("http://h:1/v1/") == typed  # the server the key was typed for
    # Another typed server (a resumed run's) gets neither the session key nor the stored one.
    assert key("http://other:2/v1") not in (typed, "sk-env-" + "x" * 20)


@pytest.mark.parametrize("status", ["satisfied", "failed", "grader_error",
                                    "max_iterations_reached", "interrupted", "error", "running"])
def test_next_steps_every_status(status: str) -> None:
    advice = sup.next_steps(status, error="boom", grader_model="rules")
    assert status in advice.headline
    assert advice.steps
    assert (advice.level == "success") == (status == "satisfied")


def test_next_steps_failed_with_rules_suggests_llm_grader() -> None:
    steps = sup.next_steps("failed", grader_model="rules").steps
    assert any(sup.LLM_GRADER_HINT in s for s in steps)


def test_progress_and_answer_markdown() -> None:
    assert sup.progress(0, 4) == (0.25, "Pass 1 of 4")
    assert sup.progress(9, 4) == (1.0, "Pass 4 of 4")
    assert sup.answer_markdown("a\nb\n```\nx\n```") == "a  \nb  \n```\nx\n```"


def test_pass_headline_and_verdict_frame() -> None:
    ev = _ev(1, "x", {"A": True, "B": False})
    assert "Pass 2" in sup.pass_headline(ev) and "1/2" in sup.pass_headline(ev)
    frame = sup.verdict_frame(ev)
    assert list(frame.columns) == ["criterion", "passed", "gap", "note"]
    assert frame.loc[1, "gap"] == "fix B" and frame.loc[0, "gap"] == ""
    assert frame["note"].tolist() == ["", ""]  # graded once, nothing regressed
    ev = ev | {"repeats": 3, "unstable": ["B"], "regressed": ["B"], "stalled": True,
               "criteria": [{"name": "A", "passed": True, "agreement": 1.0},
                            {"name": "B", "passed": False, "gap": "fix B", "agreement": 2 / 3}]}
    assert sup.verdict_frame(ev)["note"].tolist() == [
        "3/3 repeats agree", "regressed · unstable: 2/3 repeats agree"]
    assert sup.pass_headline(ev).endswith(
        "(answer unchanged from the previous pass · 1 criterion verdict(s) unstable across 3 "
        "gradings)")


def test_welcome_message_only_for_an_untouched_form() -> None:
    welcome = sup.welcome_message(" ", "\n")
    assert welcome is not None and welcome.level == "info" and "Load example" in welcome.text
    assert sup.welcome_message("Say hi", "") is None
    assert sup.welcome_message("", "- a") is None


# --------------------------------------------------------------------------- review


def test_filters_kwargs() -> None:
    assert sup.RunFilters().kwargs() == {"status": None, "model": None, "text": None,
                                         "origin": None}
    assert sup.RunFilters(("failed", "bogus"), " demo ", " x ").kwargs() == {
        "status": ["failed"], "model": "demo", "text": "x", "origin": None}
    assert sup.RunFilters(origin="single").kwargs()["origin"] == "single"
    assert sup.page_count(0) == 1 and sup.page_count(101, 50) == 3


def test_iteration_table_and_heatmap() -> None:
    evs = [_ev(0, "one", {"A": False, "B": True}), _ev(1, "two", {"A": True, "B": True})]
    table = sup.iteration_table(evs)
    # People count passes from 1; the seed's 0-based `iteration` stays in the export.
    assert list(table.columns) == ["pass", "criterion", "passed", "gap", "note",
                                   "verdict", "explanation", "duration_s", "tokens"]
    assert len(table) == 4 and table.loc[0, "gap"] == "fix A" and table.loc[0, "tokens"] == 15
    assert table["pass"].tolist() == [1, 1, 2, 2]
    heat = sup.heatmap_table(evs, "- A\n- B\n- C")
    assert list(heat.columns) == ["pass 1", "pass 2"]
    assert heat.loc["A"].tolist() == ["fail", "pass"] and heat.loc["C"].tolist() == ["—", "—"]
    assert "d3f9d8" in sup.heatmap_css("pass") and sup.heatmap_css("x") == ""


def test_iteration_table_grader_error_row() -> None:
    ev = _ev(0, "x", {}) | {"result": "grader_error", "criteria": []}
    table = sup.iteration_table([ev])
    assert len(table) == 1 and table.loc[0, "verdict"] == "grader_error"


def test_diff_html_escapes_and_marks() -> None:
    out = sup.diff_html("a <b> c", "a <i> c")
    assert "<del" in out and "&lt;b&gt;" in out and "<ins" in out and "&lt;i&gt;" in out
    assert "<b>" not in out


def test_changes_summary_and_evaluation_at() -> None:
    evs = [_ev(0, "one", {"A": False, "B": True}), _ev(1, "two", {"A": True, "B": False})]
    texts = [m.text for m in sup.changes_summary(evs[0], evs[1])]
    assert "Fixed: A" in texts and "Regressed: B" in texts
    assert sup.evaluation_at(evs, 2)["answer"] == "two"
    assert sup.iteration_answers(evs) == {1: "one", 2: "two"}
    with pytest.raises(KeyError):
        sup.evaluation_at(evs, 5)
    same = _ev(0, "x", {"A": True})
    assert sup.changes_summary(same, same)[0].level == "info"


def test_export_bytes_and_filtered_pairs(store: Store) -> None:
    for name in ("haiku", "photosynthesis"):
        ex = get_example(name)
        record = store.create_run(title=ex.title, prompt=ex.prompt, rubric=ex.rubric,
                                  worker_model="demo", grader_model="rules", max_iterations=3)
        store.add_evaluation(record.run_id, _ev(0, "=1+1", {"A": True}))
    pairs = sup.filtered_pairs(store, sup.RunFilters(text="haiku"))
    assert len(pairs) == 1 and pairs[0][0].title == get_example("haiku").title
    from rubric_core.export import runs_frame

    csv_bytes, json_bytes = sup.export_bytes(runs_frame(pairs))
    import io

    frame = pd.read_csv(io.BytesIO(csv_bytes))
    assert tuple(frame.columns) == EXPORT_COLUMNS and frame.loc[0, "answer"] == "'=1+1"
    assert pd.read_json(io.BytesIO(json_bytes)).loc[0, "answer"] == "=1+1"


def test_library_helpers(store: Store) -> None:
    assert sup.save_library_rubric(store, "r", "- A").text.endswith("version 1.")
    assert sup.save_library_rubric(store, "", "- A").level == "error"
    store.save_rubric("r", "- B")
    state: dict[str, Any] = {"library_select": "r", "library_version": 1}
    sup.load_library_rubric(state, store)
    assert state["rubric_text"] == "- A" and state["author_notice"].level == "success"
    state = {"library_select": "r", "library_version": None}
    sup.load_library_rubric(state, store)
    assert state["rubric_text"] == "- B"
    state = {"library_select": "nope", "library_version": None}
    sup.load_library_rubric(state, store)
    assert state["author_notice"].level == "error"


def test_every_example_is_offered() -> None:
    assert list(sup.example_choices()) == [e.name for e in list_examples()]


def test_history_frame_and_label(store: Store) -> None:
    record = store.create_run(_form().titled())
    frame = sup.history_frame([record])
    assert frame.loc[0, "status"] == "running" and frame.loc[0, "run_id"] == record.run_id
    assert record.run_id[:8] in sup.run_label(record)


def test_changes_summary_across_rubrics() -> None:
    a = _ev(0, "one", {"A": False, "B": True})
    b = _ev(0, "two", {"a": True, "C": False})
    texts = [m.text for m in sup.changes_summary(a, b, rubrics=("- A\n- B", "- a\n- C"))]
    assert texts[0].startswith("These runs were graded against different rubrics: 1 criterion")
    assert "Only in the first: B." in texts[0] and "Only in the second: C." in texts[0]
    assert "Fixed: a" in texts
    apart = sup.changes_summary(_ev(0, "x", {"A": True}), _ev(0, "y", {"Z": True}),
                                rubrics=("- A", "- Z"))
    assert [m.text for m in apart] == [
        "These runs were graded against different rubrics: no criterion is shared, so none "
        "can be compared. Only in the first: A. Only in the second: Z."]
    same = sup.changes_summary(a, a, rubrics=("- A\n- B", "- A\n- B"))
    assert all("different rubrics" not in m.text for m in same)



@pytest.mark.parametrize(
    ("measure", "shown", "axis_format"),
    [
        pytest.param("first_pass_fail_rate", ["100%", "50%", "—"], ".0%", id="fail_rate"),
        pytest.param("mean_passes_to_fix", ["2.00", "1.50", "—"], "~g", id="passes_to_fix"),
    ],
)
def test_analytics_chart_names_criteria_in_rubric_order_with_full_names_on_hover(
    measure: str, shown: list[str], axis_format: str
) -> None:
    names = ["Zebra: " + "a very long criterion name " * 6, "Alpha is short", "Middle one"]
    table = pd.DataFrame({"criterion": names, "first_pass_fail_rate": [1.0, 0.5, None],
                          "mean_passes_to_fix": [2.0, 1.5, None]})
    spec = sup.analytics_chart(table, measure).to_dict()
    y, x = spec["encoding"]["y"], spec["encoding"]["x"]
    assert (y["field"], y["sort"], y["title"]) == ("criterion", names, None)  # rubric order
    assert y["axis"]["labelLimit"] == CHART_LABEL_LIMIT_PX
    assert x["axis"]["format"] == axis_format and x["title"] == sup.CHART_MEASURES[measure]
    assert [t["field"] for t in spec["encoding"]["tooltip"]] == ["criterion", "shown"]
    [rows] = spec["datasets"].values()
    assert [r["criterion"] for r in rows] == names  # whole names, for the tooltip
    assert [r["shown"] for r in rows] == shown
    assert [r["value"] for r in rows][2] == 0.0  # no value: its row stays, without a bar
    assert spec["height"] == {"step": CHART_ROW_PX}

# --------------------------------------------------------------------------- experiments


def _bundled(store: Store, configs: list[Any] | None = None) -> str:
    from rubric_core.experiments import create_experiment
    from rubric_core.offline.demo_dataset import demo_dataset
    from rubric_core.settings import ExperimentConfig

    exp = create_experiment(store, demo_dataset(), configs or [ExperimentConfig()])
    return exp.experiment_id


def test_import_dataset_stores_whole_or_nothing(store: Store) -> None:
    bad = sup.import_dataset(store, "id,prompt\na,hi\na,again\n", name="dup")
    assert bad.level == "error" and "row 3, column 'id'" in bad.text
    assert store.list_datasets() == []
    ok = sup.import_dataset(store, b"prompt\nhi\n", name="one")
    assert ok.level == "success" and "version 1" in ok.text
    again = sup.import_dataset(store, b"prompt\nhi\n", name="one")
    assert again.level == "info" and "unchanged" in again.text
    assert sup.dataset_name_for("dir/my data.csv") == "my data"
    assert sup.import_dataset(store, b"prompt\nhi\n", name=" ").level == "error"
    binary = sup.import_dataset(store, b"\xff\xfe\x00garbage", name="bin")
    assert binary.level == "error" and "not UTF-8" in binary.text
    assert binary.text.endswith(".") and not binary.text.endswith("..")


def test_stored_dataset_is_parsed_once_per_version(store: Store) -> None:
    sup.import_dataset(store, b"prompt\nhi\n", name="one")
    first = sup.stored_dataset(store, "one")
    assert sup.stored_dataset(store, "one", 1) is first  # a rerun of the page parses nothing
    assert [r.prompt for r in first.dataset.rows] == ["hi"] and first.unknown_to_demo == 1
    sup.import_dataset(store, b"prompt\nhello\nthere\n", name="one")
    assert [r.prompt for r in sup.stored_dataset(store, "one").dataset.rows] == [
        "hello", "there"]
    assert sup.stored_dataset(store, "one", 1) is first
    # Deleted and stored again: version 1 again, but new rows.
    store.delete_dataset("one")
    sup.import_dataset(store, b"prompt\nagain\n", name="one")
    assert [r.prompt for r in sup.stored_dataset(store, "one", 1).dataset.rows] == ["again"]
    with pytest.raises(KeyError, match="no stored dataset 'one' version 7"):
        sup.stored_dataset(store, "one", 7)
    warnings = sup.check_configs(sup.configs_from_state(sup.form_defaults({})), secrets={},
                                 dataset=sup.stored_dataset(store, "one"))
    assert [w.level for w in warnings] == ["warning"] and "1 of 1 rows" in warnings[0].text


def test_configs_from_state_reads_every_block() -> None:
    state = sup.form_defaults({"rubric_text": "- c1", "max_iterations": 4})
    state.update({"exp_config_count": 2, sup.config_key(1, "worker"): "openai:gpt-4.1-mini",
                  sup.config_key(1, "tools"): ["word_count"], "base_url": " http://h/v1 "})
    first, second = sup.configs_from_state(state)
    assert (first.worker_model, first.grader_model, first.max_iterations) == ("demo", "rules", 4)
    assert first.rubric == "- c1" and first.base_url == "http://h/v1"
    assert second.worker_model == "openai:gpt-4.1-mini" and second.grader_tools == ("word_count",)


def test_stop_from_another_rerun_stops_the_registered_experiment(store: Store) -> None:
    from rubric_core.experiments import SharedBackoff

    exp_id = _bundled(store)
    backoff = SharedBackoff()
    models = sup.app_models({}, session_key=None, sidebar_base_url=None, token_delay_s=0.0,
                            backoff=backoff)
    events = sup.live_experiment(store, exp_id, models=models, backoff=backoff, concurrency=1)
    assert next(events)["type"] == "experiment_progress"
    assert sup.experiment_active(exp_id)
    with pytest.raises(RuntimeError, match="already running"):
        next(sup.live_experiment(store, exp_id, models=models, backoff=backoff))
    assert sup.stop_experiment(exp_id)
    last = list(events)[-1]
    assert last["type"] == "experiment_finished" and last["status"] == "stopped"
    assert not sup.experiment_active(exp_id) and not sup.stop_experiment(exp_id)
    assert sup.wait_experiment_inactive(exp_id, timeout_s=0.1)
    assert sup.can_resume(store.get_experiment(exp_id))


def test_results_grid_cells_open_their_runs_and_exports(store: Store) -> None:
    from rubric_core.experiments import experiment_results, export_columns, run_experiment
    from rubric_core.settings import ExperimentConfig

    exp_id = _bundled(store, [ExperimentConfig(), ExperimentConfig(max_iterations=1)])
    list(run_experiment(store, exp_id))
    results = experiment_results(store, exp_id)
    grid = sup.results_grid(results)
    assert list(grid.table.columns) == ["row", "1. demo × rules", "2. demo × rules"]
    assert len(grid.table) == 24
    assert grid.table.iloc[0, 1].startswith("satisfied · 2 passes")
    cell = results.cells[0]
    assert cell.run_id is not None
    assert sup.picked_cell({"selection": {"cells": [[0, "1. demo × rules"]]}}, grid) == (
        cell.run_id)
    assert sup.picked_cell({"selection": {"cells": []}}, grid) is None
    assert sup.picked_cell({"selection": {"cells": [[99, "x"]]}}, grid) is None
    view = sup.comparison_view(results, 0, 1)
    assert set(view.flips["change"]) == {"pass → fail"}
    assert "McNemar's exact p = " in view.headline
    assert sup.failed_cells(results) == []
    csv_text = sup.export_data(store, exp_id, "csv")().decode()
    frame = pd.read_csv(io.StringIO(csv_text))
    assert tuple(frame.columns) == export_columns(store, exp_id)
    assert set(frame["config_index"]) == {0, 1}
    records = json.loads(sup.export_data(store, exp_id, "json")())
    assert len(records) == len(frame)
    summary = pd.read_csv(io.StringIO(sup.summary_csv(store, exp_id)()))
    assert summary["satisfied_pct"].iloc[0] == 100.0 and len(summary) == 2


def test_experiment_models_share_the_backoff_client_and_keep_the_key_rule(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from rubric_core.experiments import SharedBackoff

    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-" + "x" * 16)
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    backoff = SharedBackoff()
    models = sup.app_models({}, session_key=None, sidebar_base_url="http://127.0.0.1:9/v1",
                            token_delay_s=0.0, backoff=backoff)
    model = models("openai-compatible:m", "worker", "http://127.0.0.1:9/v1")
    assert model.http_client is backoff.http_client()  # type: ignore[attr-defined]
    # Cells run on the experiments' event loop: their calls go through the async client.
    assert model.http_async_client is backoff.http_async_client()  # type: ignore[attr-defined]
    assert model.disable_streaming is True  # type: ignore[attr-defined]  # nobody watches
    # As the CLI's: one model per model string and endpoint, so one compiled agent.
    assert models("openai-compatible:m", "grader", "http://127.0.0.1:9/v1") is model
    # A typed base URL never gets the stored key.
    key = model.openai_api_key  # type: ignore[attr-defined]
    assert key is None or "sk-env" not in key.get_secret_value()
    assert models("demo", "worker", None) is not None


def test_a_bad_paste_without_a_name_names_the_row_and_column(tmp_path: Path) -> None:
    with Store(tmp_path / "db.sqlite3") as store:
        bad = sup.import_dataset(store, 'prompt,topic\n"About {topc}",rain\n', name="")
        assert bad.level == "error" and "row 2, column 'prompt' uses {topc}" in bad.text
        empty = sup.import_dataset(store, "", name="")
        assert empty.level == "error" and "the dataset is empty" in empty.text
        nameless = sup.import_dataset(store, "prompt\nhello\n", name="  ")
        assert nameless.text == "Give the dataset a name, then store it again."
        assert store.list_datasets() == []


@pytest.mark.parametrize(("widgets", "message"), [
    pytest.param((99, "majority", False), "grader_repeats must be from 1 to 9, got 99",
                 id="too_many"),
    pytest.param((2.5, "majority", False), "grader_repeats must be from 1 to 9, got 0",
                 id="not_whole"),
    pytest.param(("3", "majority", False), "grader_repeats must be from 1 to 9, got 0",
                 id="text"),
    pytest.param((True, "majority", False), "grader_repeats must be from 1 to 9, got 0",
                 id="bool"),
    pytest.param((3, "most", False), "consensus must be one of majority, unanimous",
                 id="unknown_consensus"),
    pytest.param((3, None, False), "consensus must be one of majority, unanimous",
                 id="no_consensus"),
])
def test_tampered_judging_widgets_are_reported_not_raised(
    widgets: tuple[object, object, object], message: str
) -> None:
    from rubric_core.settings import ExperimentConfig

    fields = sup.judging_from_widgets(*widgets)
    assert fields["return_best"] is False
    state = {"prompt": "p", "rubric_text": "- a", "grader_repeats": widgets[0],
             "consensus": widgets[1], "return_best": "yes"}
    settings = sup.settings_from_state(state)  # builds, whatever the widgets held
    assert settings.return_best is False  # only a real True turns it on
    errors = [m.text for m in sup.check_form(settings, secrets={}) if m.level == "error"]
    assert any(message in e and e.startswith("Verdict stability:") for e in errors), errors
    config = ExperimentConfig(rubric="- a", **fields)
    errors = [m.text for m in sup.check_configs([config], secrets={}) if m.level == "error"]
    assert any(e.startswith("Configuration 1: Verdict stability:") and message in e
               for e in errors), errors


def test_streamlit_watches_no_files() -> None:
    # Issue 24.7: installing packages flooded the server's log with file events; and a source
    # file changed under a running server made Streamlit re-import its module, so the host
    # check's record of being in the request path was lost and the page refused to draw.
    import tomllib

    config = tomllib.loads((Path(__file__).parents[1] / ".streamlit/config.toml").read_text())
    assert config["server"]["fileWatcherType"] == "none"
