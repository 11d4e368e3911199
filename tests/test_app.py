"""The Streamlit app, driven with AppTest: pages, authoring, live runs, resume, review, export."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from openai_server import DelayedServer, FakeOpenAI, error, slow, text, verdict
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest

from rubric_core import app_support as sup
from rubric_core import session
from rubric_core.examples import get_example, list_examples
from rubric_core.export import EXPORT_COLUMNS
from rubric_core.settings import RunSettings
from rubric_core.store import Store

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [e.name for e in list_examples()]


def _texts(elements: Any) -> str:
    return "\n".join(str(e.value) for e in elements)


def _messages(at: AppTest) -> str:
    return "\n".join(_texts(x) for x in (at.error, at.warning, at.info, at.success))


@pytest.fixture(autouse=True)
def navigation_routing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route every AppTest run through app.py's st.navigation, as the server does.

    AppTest resets ``PagesManager.uses_pages_directory`` before each run; with a ``pages/``
    directory next to app.py that selects the legacy multipage mode, in which
    ``switch_page`` runs the page file alone (no app.py, no sidebar). The live server sets
    the flag to False for good at the first ``st.navigation`` call. AppTest resets a
    subclass here, so the real flag stays False.
    """

    class _Pages(PagesManager):
        pass

    monkeypatch.setattr(PagesManager, "uses_pages_directory", False)
    monkeypatch.setattr("streamlit.testing.v1.app_test.PagesManager", _Pages)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "db.sqlite3"


@pytest.fixture
def app(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(sup.TOKEN_DELAY_ENV, "0")
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db_path)
    at.run()
    assert not at.exception
    return at


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, at.exception
    return at


def load_example(at: AppTest, name: str) -> None:
    goto(at, "author")
    at.selectbox(key="example_select").set_value(name)
    at.button(key="load_example").click().run()
    assert not at.exception


def run_loop(at: AppTest) -> Store:
    goto(at, "run")
    button = at.button(key="run_button")
    assert not button.disabled, _messages(at)
    button.click().run()
    assert not at.exception, at.exception
    return Store(at.session_state["db_path"])


# --------------------------------------------------------------------------- pages


@pytest.mark.parametrize("page", ["author", "run", "review", "experiments", "lab"])
def test_every_page_renders(app: AppTest, page: str, db_path: Path) -> None:
    goto(app, page)
    assert db_path.exists()
    assert str(db_path) in _texts(app.sidebar.caption)
    assert app.sidebar.selectbox(key="worker_model").value == "demo"
    assert app.sidebar.selectbox(key="grader_model").value == "rules"
    assert app.sidebar.number_input(key="max_iterations").value == 3


def test_form_survives_page_switches(app: AppTest) -> None:
    app.text_area(key="prompt").input("Say hi").run()
    goto(app, "review")
    goto(app, "author")
    assert app.text_area(key="prompt").value == "Say hi"


# --------------------------------------------------------------------------- authoring


def test_first_visit_welcomes_instead_of_erroring(app: AppTest) -> None:
    assert "New here?" in _texts(app.info)
    assert not app.error


def test_empty_rubric_is_an_error(app: AppTest) -> None:
    app.text_area(key="prompt").input("Say hi").run()
    app.text_area(key="rubric_text").input("").run()
    assert "rubric is empty" in _texts(app.error)
    assert "New here?" not in _texts(app.info)


def test_duplicate_criterion_is_reported(app: AppTest) -> None:
    app.text_area(key="rubric_text").input(
        "- The poem has three lines\n- The poem has three lines").run()
    assert "Duplicate criterion" in _messages(app)


def test_rules_unrecognised_warning_and_llm_grader_hides_it(app: AppTest) -> None:
    app.text_area(key="rubric_text").input("- The tone is warm and friendly").run()
    assert "rules grader cannot check" in _texts(app.warning)
    app.sidebar.selectbox(key="grader_model").set_value("hybrid:openai:gpt-4.1-mini").run()
    assert "rules grader cannot check" not in _texts(app.warning)


def test_load_example_selects_its_tools_and_shows_criteria(app: AppTest) -> None:
    load_example(app, "find_duplicates")
    assert app.session_state["grader_tools"] == ["run_find_duplicates_tests"]
    assert "find_duplicates" in app.text_area(key="prompt").value
    assert "run_find_duplicates_tests" in app.multiselect(key="grader_tools").options
    assert "2 criteria" in _texts(app.caption)
    assert not app.error


def test_sidebar_names_the_code_sandbox_in_use(app: AppTest) -> None:
    assert "Code sandbox: bubblewrap (kernel-isolated)." in _texts(app.sidebar.caption)
    load_example(app, "find_duplicates")
    assert not [m for m in app.error if "sandbox" in str(m.value).lower()]


def test_author_warns_when_code_running_tools_cannot_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, db_path: Path
) -> None:
    monkeypatch.setenv("RUBRIC_STUDIO_BWRAP", str(tmp_path / "missing-bwrap"))
    monkeypatch.setenv(sup.TOKEN_DELAY_ENV, "0")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db_path)
    at.run()
    assert "Code sandbox: unavailable" in _texts(at.sidebar.warning)
    load_example(at, "find_duplicates")
    errors = _texts(at.error)
    assert "`run_find_duplicates_tests` run the candidate's code" in errors
    assert "apt-get install bubblewrap" in errors
    # A rubric without code-running tools gets no such error.
    at.multiselect(key="grader_tools").set_value([]).run()
    assert "run the candidate's code" not in _texts(at.error)


def test_author_warns_in_unsafe_process_mode(
    monkeypatch: pytest.MonkeyPatch, db_path: Path
) -> None:
    monkeypatch.setenv("RUBRIC_STUDIO_SANDBOX", "unsafe-process")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db_path)
    at.run()
    assert "Code sandbox: unsafe-process. UNSAFE" in _texts(at.sidebar.warning)
    load_example(at, "find_duplicates")
    assert "without kernel isolation" in _texts(at.warning)


def test_a_typed_base_url_asks_for_a_session_key_instead_of_the_stored_one(
    monkeypatch: pytest.MonkeyPatch, db_path: Path
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-stored-" + "x" * 16)
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db_path)
    at.run()
    assert not [w for w in at.sidebar.text_input if w.key == "session_api_key"]
    at.text_input(key="base_url").set_value("http://127.0.0.1:9/v1").run()
    [field] = [w for w in at.sidebar.text_input if w.key == "session_api_key"]
    assert field.proto.type == field.proto.PASSWORD
    assert "never stored" in field.help
    # The operator's own base URL gets the stored key, so no field is asked for.
    monkeypatch.setenv("RUBRIC_STUDIO_BASE_URL", "http://127.0.0.1:9/v1/")
    at.run()
    assert not [w for w in at.sidebar.text_input if w.key == "session_api_key"]


def test_rubric_library_save_and_load(app: AppTest) -> None:
    load_example(app, "haiku")
    app.text_input(key="rubric_name").input("poems").run()
    app.button(key="save_rubric").click().run()
    assert "version 1" in _texts(app.success)
    app.text_area(key="rubric_text").input("- The poem has three lines").run()
    app.button(key="save_rubric").click().run()
    assert "version 2" in _texts(app.success)
    app.selectbox(key="library_select").set_value("poems").run()
    app.selectbox(key="library_version").set_value(1).run()
    app.button(key="load_rubric").click().run()
    assert app.text_area(key="rubric_text").value == list_examples()[0].rubric


# --------------------------------------------------------------------------- runs


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_runs_offline_to_satisfied(app: AppTest, name: str) -> None:
    load_example(app, name)
    store = run_loop(app)
    assert "Final status: satisfied" in _texts(app.success)
    run = store.get_run(app.session_state["last_run_id"])
    assert run is not None and run.status == "satisfied"
    assert run.worker_model == "demo" and run.grader_model == "rules"
    evaluations = store.evaluations(run.run_id)
    assert len(evaluations) == run.iterations >= 2
    assert evaluations[-1]["result"] == "satisfied"


def _backdate(db_path: Path, run_id: str) -> None:
    """Age a run's heartbeat past `session.STALE_AFTER_S`, as a dead owner leaves it."""
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("UPDATE runs SET updated_at = '2000-01-01T00:00:00.000000+00:00' "
                     "WHERE run_id = ?", (run_id,))
    conn.close()


def _iterations(db_path: Path) -> int:
    with Store(db_path) as store:
        return sum(r.iterations for r in store.list_runs())


def _interrupted_run(db_path: Path, example: str) -> tuple[str, list[dict]]:
    ex = next(e for e in list_examples() if e.name == example)
    settings = RunSettings(prompt=ex.prompt, rubric=ex.rubric, example_name=ex.name,
                           worker_system_prompt=ex.worker_system_prompt,
                           grader_tools=tuple(t.name for t in ex.grader_tools()))
    with Store(db_path) as store:
        run = session.start(store, settings)
        graded = False
        for event in run:
            graded = graded or event["type"] == "evaluation_finished"
            if graded and event["type"] == "worker_token":
                break
        run.close()  # what a Stop or a rerun does to the page's loop
        assert store.get_run(run.run_id).status == "interrupted"
        return run.run_id, store.evaluations(run.run_id)


def test_resume_continues_the_same_grading_run(app: AppTest, db_path: Path) -> None:
    run_id, first = _interrupted_run(db_path, "haiku")
    goto(app, "run")
    assert app.selectbox(key="resume_select_None").value == run_id
    app.button(key="resume_button").click().run()
    assert not app.exception
    assert "Final status: satisfied" in _texts(app.success)
    with Store(db_path) as store:
        run = store.get_run(run_id)
        evaluations = store.evaluations(run_id)
    assert run.status == "satisfied"
    assert {e["grading_run_id"] for e in evaluations} == {first[0]["grading_run_id"]}
    assert evaluations[: len(first)] == first and len(evaluations) > len(first)


def test_running_record_from_a_killed_server_is_resumable(app: AppTest, db_path: Path) -> None:
    with Store(db_path) as store:
        ex = list_examples()[1]
        record = store.create_run(title="killed", prompt=ex.prompt, rubric=ex.rubric,
                                  worker_model="demo", grader_model="rules", max_iterations=4)
    goto(app, "run")
    assert not [b for b in app.button if b.key == "resume_button"]  # its owner may be alive
    _backdate(db_path, record.run_id)
    goto(app, "run")
    app.button(key="resume_button").click().run()
    assert "Final status: satisfied" in _texts(app.success)
    with Store(db_path) as store:
        assert store.get_run(record.run_id).status == "satisfied"


def test_a_run_whose_process_was_killed_resumes_in_a_new_browser_session(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 10: the killed run stayed needs_revision (0.0 s) and was never offered for Resume;
    # then Resume in a new session lacked the base URL, which was not stored with the run.
    monkeypatch.setenv(sup.TOKEN_DELAY_ENV, "0")
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    monkeypatch.setattr(session, "STALE_AFTER_S", 0.5)
    with FakeOpenAI() as server:
        server.enqueue(text("first draft"), verdict("needs_revision", ("c2",)),
                       slow(60, text("never sent")), text("second draft"), verdict("satisfied"))
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "rubric_core", "run", "--model", "openai-compatible:w",
             "--grader", "openai-compatible:g", "--base-url", server.base_url, "--prompt",
             "write it", "--rubric", "- c1\n- c2", "--db", str(db_path), "--thread", "th"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            # The revision request hangs, the first pass is recorded: kill it there.
            while len(server.requests) < 3 or _iterations(db_path) < 1:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait()
        with Store(db_path) as store:
            [killed] = store.list_runs()
            assert killed.status == "running" and killed.iterations == 1
            assert killed.settings.base_url == server.base_url
        time.sleep(0.6)

        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
        at.session_state["db_path"] = str(db_path)  # a new browser session: no base URL typed
        at.run()
        goto(at, "run")
        assert at.selectbox(key="resume_select_None").value == killed.run_id
        assert "interrupted" in at.selectbox(key="resume_select_None").format_func(
            killed.run_id)
        at.button(key="resume_button").click().run()
        assert not at.exception, at.exception
        assert f"Resuming run {killed.run_id[:8]}" in _texts(at.info)
        header = _texts(at.markdown)  # the models wrap in the Run header (no cut-off metric)
        assert "openai-compatible:w" in header and "openai-compatible:g" in header
        assert "needs a base URL" not in _messages(at)
        assert "Final status: satisfied" in _texts(at.success)
    with Store(db_path) as store:
        run = store.get_run(killed.run_id)
        assert run.status == "satisfied" and run.iterations == 2
        assert [e["answer"] for e in store.evaluations(run.run_id)] == [
            "first draft", "second draft"]
    assert not [b for b in at.button if b.key == "resume_button"]


def test_the_resume_picker_is_fresh_after_a_resume(app: AppTest, db_path: Path) -> None:
    # Issue 10: after one Resume the picker still listed the finished run and the next Resume
    # continued a different run than the one shown.
    older, _ = _interrupted_run(db_path, "photosynthesis")
    newer, _ = _interrupted_run(db_path, "haiku")
    goto(app, "run")
    picker = app.selectbox(key="resume_select_None")
    assert picker.options == [picker.format_func(newer), picker.format_func(older)]
    picker.set_value(older).run()
    app.button(key="resume_button").click().run()
    assert not app.exception
    assert app.session_state["last_run_id"] == older
    picker = app.selectbox(key=f"resume_select_{older}")
    assert picker.value == newer and len(picker.options) == 1  # the finished one is gone
    app.button(key="resume_button").click().run()
    assert app.session_state["last_run_id"] == newer
    with Store(db_path) as store:
        assert {store.get_run(r).status for r in (older, newer)} == {"satisfied"}
    assert not [b for b in app.button if b.key == "resume_button"]


def test_resume_is_advised_only_for_runs_the_page_lists(app: AppTest, db_path: Path) -> None:
    load_example(app, "haiku")
    app.sidebar.text_input(key="base_url").input("http://127.0.0.1:9/v1").run()
    app.sidebar.selectbox(key="worker_model").set_value("openai-compatible:llama3.1").run()
    store = run_loop(app)
    run = store.get_run(app.session_state["last_run_id"])
    assert run.status == "error"
    listed = [b for b in app.button if b.key == "resume_button"]
    assert listed and "press Resume" in _texts(app.markdown)
    with Store(db_path) as s:
        s.finish_run(run.run_id, "grader_error")
    goto(app, "run")
    assert "press Resume" not in _texts(app.markdown)


# --------------------------------------------------------------------------- review, export


@pytest.fixture
def captured_files(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def capture(self: Any, data: Any, mimetype: str, kind: Any, filename: str | None = None
                ) -> str:
        if filename and isinstance(data, bytes):
            files[filename] = data
        return original(self, data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", capture)
    return files


def test_review_side_by_side_and_export(app: AppTest, captured_files: dict[str, bytes]) -> None:
    load_example(app, "haiku")
    store = run_loop(app)
    run_id = app.session_state["last_run_id"]
    goto(app, "review")
    assert app.selectbox(key="review_run").value == run_id
    assert len(app.dataframe) >= 3  # history, iterations, heatmap
    diff = _texts(app.html)
    assert "<del" in diff and "<ins" in diff
    assert "Fixed:" in _texts(app.success)
    assert "Grader tools: none" in _texts(app.caption)  # the haiku is checked by rules alone

    evaluations = store.evaluations(run_id)
    n_rows = sum(len(e["criteria"]) or 1 for e in evaluations)
    csv = pd.read_csv(io.BytesIO(captured_files[f"run-{run_id[:8]}.csv"]))
    assert tuple(csv.columns) == EXPORT_COLUMNS and len(csv) == n_rows
    assert set(csv["run_id"]) == {run_id}
    records = json.loads(captured_files[f"run-{run_id[:8]}.json"])
    assert len(records) == n_rows and set(records[0]) == {*EXPORT_COLUMNS, "calls"}

    app.button(key="prepare_export").click().run()
    all_csv = pd.read_csv(io.BytesIO(captured_files["rubric-runs.csv"]))
    assert tuple(all_csv.columns) == EXPORT_COLUMNS and len(all_csv) == n_rows


def test_review_compares_two_runs_and_filters(app: AppTest) -> None:
    load_example(app, "haiku")
    run_loop(app)
    load_example(app, "photosynthesis")
    run_loop(app)
    goto(app, "review")
    app.radio(key="cmp_mode").set_value("Final answers of two runs").run()
    assert not app.exception and "<ins" in _texts(app.html)
    # Issue 10: two rubrics used to read as "No criterion changed between these two."
    assert "graded against different rubrics" in _texts(app.info)
    assert "No criterion changed" not in _texts(app.info)
    app.text_input(key="filter_text").input("haiku").run()
    assert "1 run(s) match" in _texts(app.caption)
    app.multiselect(key="filter_status").set_value(["failed"]).run()
    assert "No runs match" in _texts(app.info)


def test_history_pages_through_many_runs(app: AppTest, db_path: Path) -> None:
    with Store(db_path) as store:
        for i in range(120):
            store.create_run(title=f"run {i}", prompt="p", rubric="- r", worker_model="demo",
                             grader_model="rules", max_iterations=3)
    goto(app, "review")
    assert "120 run(s) match; showing 50" in _texts(app.caption)
    app.number_input(key="history_page").set_value(3).run()
    assert "showing 20" in _texts(app.caption)


# --------------------------------------------------------------------------- bad input


def test_empty_prompt_blocks_the_run(app: AppTest) -> None:
    goto(app, "run")
    assert "prompt is empty" in _texts(app.error)
    assert app.button(key="run_button").disabled


def test_rules_grader_on_unknown_criteria_ends_failed(app: AppTest) -> None:
    app.text_area(key="prompt").input("Write a greeting.").run()
    app.text_area(key="rubric_text").input("- The tone is warm and friendly").run()
    store = run_loop(app)
    assert "rules grader cannot check" in _texts(app.warning)
    assert "Final status: failed" in _texts(app.error)
    assert "Grader's last explanation" in _texts(app.caption)
    assert store.get_run(app.session_state["last_run_id"]).status == "failed"


def test_max_iterations_out_of_range_is_corrected(db_path: Path) -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db_path)
    at.session_state["max_iterations"] = 99
    at.run()
    assert not at.exception
    assert "outside 1–50" in _texts(at.sidebar.warning)
    assert at.sidebar.number_input(key="max_iterations").value == 50


def test_missing_api_key_is_explained(app: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    load_example(app, "haiku")
    app.sidebar.selectbox(key="worker_model").set_value("openai:gpt-4.1-mini").run()
    assert not app.exception
    assert "OPENAI_API_KEY" in _texts(app.sidebar.warning)
    goto(app, "run")
    assert "OPENAI_API_KEY" in _texts(app.error)
    assert app.button(key="run_button").disabled


def test_unknown_provider_is_explained(db_path: Path) -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db_path)
    # A string typed into the selectbox (accept_new_options); AppTest cannot type new
    # options, so it arrives through session state as the browser would send it.
    at.session_state["grader_model"] = "nosuch:model"
    at.run()
    assert not at.exception
    assert at.sidebar.selectbox(key="grader_model").value == "nosuch:model"
    assert "nosuch" in _texts(at.sidebar.warning)
    goto(at, "run")
    assert "Grader model" in _texts(at.error) and "nosuch" in _texts(at.error)
    assert at.button(key="run_button").disabled


def test_unreachable_base_url_ends_with_next_steps(app: AppTest) -> None:
    load_example(app, "haiku")
    app.sidebar.text_input(key="base_url").input("http://127.0.0.1:9/v1").run()
    app.sidebar.selectbox(key="worker_model").set_value("openai-compatible:llama3.1").run()
    assert not app.exception
    store = run_loop(app)
    run = store.get_run(app.session_state["last_run_id"])
    assert run.status in ("error", "grader_error")
    assert f"Final status: {run.status}" in _texts(app.error)
    assert "base URL" in _texts(app.markdown)


def test_openai_compatible_server_end_to_end(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Worker and grader are real ChatOpenAI clients talking HTTP to a loopback server.
    key = "sk-app-test-must-not-be-stored"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.setenv(sup.TOKEN_DELAY_ENV, "0")

    with FakeOpenAI() as server:
        server.enqueue(text("first draft"), verdict("needs_revision", ("c2",)),
                       text("second draft, now with c2"), verdict("satisfied"))
        app = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
        # Typed values (model names via accept_new_options) arrive through session state, as
        # the browser sends them; AppTest cannot type new selectbox options.
        app.session_state["db_path"] = str(db_path)
        app.session_state["base_url"] = server.base_url
        app.session_state["worker_model"] = "openai-compatible:w"
        app.session_state["grader_model"] = "openai-compatible:g"
        app.session_state["prompt"] = "write it"
        app.session_state["rubric_text"] = "- c1\n- c2"
        app.run()
        assert not app.exception
        store = run_loop(app)
        assert server.pending == 0
        grader_bodies = [b for b in server.requests if b.get("tools")]
    assert [b["model"] for b in grader_bodies] == ["g", "g"]
    run = store.get_run(app.session_state["last_run_id"])
    assert run is not None
    assert (run.status, run.iterations) == ("satisfied", 2)
    assert (run.worker_model, run.grader_model) == ("openai-compatible:w", "openai-compatible:g")
    assert run.input_tokens and run.output_tokens  # usage reported over HTTP is recorded
    evaluations = store.evaluations(run.run_id)
    assert [e["answer"] for e in evaluations] == ["first draft", "second draft, now with c2"]
    assert "Final status: satisfied" in _texts(app.success)
    for file in db_path.parent.glob(db_path.name + "*"):  # the database and its WAL
        assert key.encode() not in file.read_bytes()


def test_unwritable_database_path(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(blocker / "db.sqlite3")
    at.run()
    assert not at.exception
    assert "Cannot use" in _texts(at.sidebar.error)
    assert at.text_area(key="prompt")  # authoring still works
    for page in ("run", "review"):
        goto(at, page)
        assert "database cannot be used" in _texts(at.error)
    assert blocker.read_text() == "x"


def test_corrupted_database_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    junk = os.urandom(4096)
    path.write_bytes(junk)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(path)
    at.run()
    assert not at.exception
    assert "not a Rubric Studio database" in _texts(at.sidebar.error)
    goto(at, "run")
    assert at.button(key="run_button").disabled
    assert path.read_bytes() == junk



@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param("postgresql://rubric:pw/Sidebar-Secret-1@127.0.0.1:1/db", "postgresql://***",
                     id="unencoded_slash"),
        pytest.param("postgresql://rubric@127.0.0.1:1/db?password=Sidebar-Secret-1",
                     "postgresql://rubric@127.0.0.1:1/db?password=***", id="query_password"),
        pytest.param("postgresql://rubric:Sidebar-Secret-1@127.0.0.1:1,127.0.0.1:2/db",
                     "postgresql://rubric:***@127.0.0.1:1,127.0.0.1:2/db", id="several_hosts"),
    ],
)
def test_a_postgresql_url_that_cannot_be_used_is_shown_without_its_password(
    url: str, shown: str
) -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = url
    at.run()
    assert not at.exception
    assert f"In use: `{shown}`" in _texts(at.sidebar.caption)
    assert "PostgreSQL" in _texts(at.sidebar.error)
    goto(at, "run")
    assert "database cannot be used" in _texts(at.error)
    everything = "\n".join(_texts(x) for x in (at.sidebar.caption, at.sidebar.error,
                                                at.markdown, at.error, at.warning))
    assert "Sidebar-Secret-1" not in everything and "pw" not in everything.replace(
        "password", "")



def test_a_database_lost_while_a_page_reads_it_is_said_on_the_page(
    app: AppTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rubric_core.store import StoreError

    def lost(*_: Any, **__: Any) -> Any:
        msg = "Lost the connection to the PostgreSQL server at db.example:5432."
        raise StoreError(msg)

    monkeypatch.setattr(Store, "count_runs", lost)
    app.switch_page("pages/review.py").run()
    assert not app.exception
    assert "Lost the connection to the PostgreSQL server" in _texts(app.error)
    assert "database cannot be used" in _texts(app.error)


# --------------------------------------------------------------------------- issue 10, 12


def _stop(at: AppTest) -> object:
    return next(b for b in at.button if b.key in ("stop_button", "stop_button_idle"))


def test_demo_worker_with_an_unknown_prompt_says_so_before_the_run(app: AppTest) -> None:
    app.text_area(key="prompt").input("Write a limerick about a tax auditor.").run()
    app.text_area(key="rubric_text").input("- The poem has five lines").run()
    goto(app, "run")
    warning = _texts(app.warning)
    assert "`demo` worker does not know this prompt" in warning
    assert "API key" in warning and "Ollama" in warning and "11434/v1" in warning
    assert not app.button(key="run_button").disabled  # a notice, not a block
    load_example(app, "haiku")
    goto(app, "run")
    assert "does not know this prompt" not in _texts(app.warning)


def test_stop_is_disabled_unless_a_run_of_this_session_is_active(app: AppTest) -> None:
    load_example(app, "haiku")
    goto(app, "run")
    assert _stop(app).disabled
    run_loop(app)
    assert _stop(app).disabled  # the run has ended
    assert "Nothing of this session is running." in _stop(app).help


def test_saving_unchanged_rubric_keeps_the_version(app: AppTest, db_path: Path) -> None:
    load_example(app, "haiku")
    app.text_input(key="rubric_name").input("poems").run()
    app.button(key="save_rubric").click().run()
    assert "version 1" in _texts(app.success)
    app.button(key="save_rubric").click().run()
    assert "“poems” unchanged: version 1 kept." in _texts(app.info)
    with Store(db_path) as store:
        assert [v["version"] for v in store.rubric_versions("poems")] == [1]


def test_rubric_library_keeps_and_loads_the_preset(app: AppTest) -> None:
    load_example(app, "find_duplicates")
    app.sidebar.number_input(key="max_iterations").set_value(5).run()
    app.text_area(key="grader_system_prompt").input("Be strict.").run()
    app.text_input(key="rubric_name").input("dups").run()
    app.button(key="save_rubric").click().run()
    assert "with its prompt, grader tools and settings" in _texts(app.success)
    load_example(app, "haiku")  # a different form
    app.sidebar.number_input(key="max_iterations").set_value(2).run()
    app.selectbox(key="library_select").set_value("dups").run()
    app.button(key="load_rubric").click().run()
    assert not app.exception
    ex = get_example("find_duplicates")
    assert app.text_area(key="prompt").value == ex.prompt
    assert app.text_area(key="rubric_text").value == ex.rubric
    assert app.text_area(key="grader_system_prompt").value == "Be strict."
    assert app.multiselect(key="grader_tools").value == ["run_find_duplicates_tests"]
    assert app.sidebar.number_input(key="max_iterations").value == 5
    assert "with its prompt, grader tools and settings" in _texts(app.success)


def test_a_history_row_selection_opens_the_run(app: AppTest) -> None:
    load_example(app, "haiku")
    run_loop(app)
    load_example(app, "photosynthesis")
    store = run_loop(app)
    newer, older = (r.run_id for r in store.list_runs())
    goto(app, "review")
    assert app.selectbox(key="review_run").value == newer
    app.session_state["history_table"] = {"selection": {"rows": [1], "columns": []}}
    app.run()
    assert not app.exception
    assert app.selectbox(key="review_run").value == older
    # The picker stays free: choosing another run is not undone by the kept selection.
    app.selectbox(key="review_run").set_value(newer).run()
    assert app.selectbox(key="review_run").value == newer


def _label(at: AppTest, target: tuple[int, str], choice: str, correct: str = "not given",
           note: str = "") -> None:
    run_id = at.selectbox(key="review_run").value
    at.selectbox(key=f"label_target_{run_id}").set_value(target)
    at.radio(key="label_choice").set_value(choice)
    at.run()
    if choice == "disagree":
        at.selectbox(key="label_correct").set_value(correct)
    at.text_input(key="label_note").input(note)
    at.button(key="save_label").click().run()
    assert not at.exception, at.exception


def test_labels_agreement_and_export(
    app: AppTest, db_path: Path, captured_files: dict[str, bytes]
) -> None:
    load_example(app, "haiku")
    store = run_loop(app)
    run_id = app.session_state["last_run_id"]
    evaluations = store.evaluations(run_id)
    goto(app, "review")
    assert app.text_input(key="labeller").value == sup.default_labeller()
    app.text_input(key="labeller").input("ana").run()
    first = evaluations[0]["criteria"]
    _label(app, (0, first[0]["name"]), "agree")
    assert "ana agrees" in _texts(app.success)
    _label(app, (0, first[1]["name"]), "disagree", note="it scans fine")
    _label(app, (1, first[0]["name"]), "agree")
    # Labelling the same verdict again under the same name replaces the label (upsert).
    _label(app, (1, first[0]["name"]), "disagree", correct="fail")
    with Store(db_path) as s:
        labels = s.labels([run_id])
    assert len(labels) == 3 and all(lb["labeller"] == "ana" for lb in labels)
    assert {(lb["seq"], lb["agree"], lb["correct"]) for lb in labels} == {
        (0, True, None), (0, False, None), (1, False, False)}
    assert "3 label(s) on this run." in _texts(app.caption)

    table = next(d.value for d in app.dataframe if "kappa" in d.value.columns)
    overall = table.iloc[-1]
    assert overall["criterion"] == "(all criteria)" and overall["n"] == 3
    assert overall["percent_agreement"] == round(100 / 3, 2)
    disagreements = next(d.value for d in app.dataframe
                         if list(d.value.columns)[:2] == ["run", "pass"])
    assert len(disagreements) == 2

    csv = pd.read_csv(io.BytesIO(captured_files["rubric-labels.csv"]), dtype=str,
                      keep_default_na=False)
    assert len(csv) == 3 and set(csv["labeller"]) == {"ana"}
    assert set(csv["label"]) == {"agree", "disagree"}
    assert "it scans fine" in set(csv["note"])


def test_a_key_typed_as_labeller_name_is_never_stored_or_shown(
    app: AppTest, db_path: Path
) -> None:
    # Attack (#23, hole 11): a key pasted into "Your name" was stored and exported as typed.
    key = "sk-proj-" + "Zq7Xw2Lm" * 5
    load_example(app, "haiku")
    store = run_loop(app)
    first = store.evaluations(app.session_state["last_run_id"])[0]["criteria"]
    goto(app, "review")
    app.text_input(key="labeller").input(key).run()
    _label(app, (0, first[0]["name"]), "agree")
    assert "[redacted] agrees" in _texts(app.success) and key not in _texts(app.success)
    assert [lb["labeller"] for lb in store.labels()] == ["[redacted]"]
    store.close()
    for path in db_path.parent.glob(db_path.name + "*"):  # the file, its WAL and shm
        assert key.encode() not in path.read_bytes(), path.name
    # An over-long note is refused with its limit, and nothing is stored (#23, hole 10).
    app.text_input(key="labeller").input("ana").run()
    _label(app, (0, first[1]["name"]), "disagree", note="x" * 5_000)
    assert "at most 2,000" in _texts(app.error), _texts(app.error)
    assert len(Store(db_path).labels()) == 1


def test_a_disagreement_opens_its_run(app: AppTest, db_path: Path) -> None:
    load_example(app, "haiku")
    store = run_loop(app)
    labelled = app.session_state["last_run_id"]
    ev = store.evaluations(labelled)[0]
    store.set_label(labelled, 0, ev["criteria"][0]["name"], "bo", agree=False)
    load_example(app, "photosynthesis")
    run_loop(app)
    goto(app, "review")
    app.multiselect(key="filter_status").set_value(["satisfied"]).run()
    app.text_input(key="filter_text").input("photosynthesis").run()  # hides the labelled run
    assert app.selectbox(key="review_run").value != labelled
    app.session_state["disagreements_table"] = {"selection": {"rows": [0], "columns": []}}
    app.run()
    assert not app.exception, app.exception
    assert app.selectbox(key="review_run").value == labelled


def test_loop_analytics_for_a_run_and_its_rubric(
    app: AppTest, captured_files: dict[str, bytes]
) -> None:
    load_example(app, "haiku")
    run_loop(app)
    run_loop(app)
    goto(app, "review")
    run_id = app.selectbox(key="review_run").value
    frame = pd.read_csv(io.BytesIO(captured_files[f"analytics-{run_id[:8]}.csv"]))
    assert list(frame["grading_runs"]) == [1, 1, 1]
    app.radio(key="analytics_scope").set_value("All runs of this rubric").run()
    assert "over 2 run(s)" in _texts(app.caption)
    frame = pd.read_csv(io.BytesIO(captured_files[f"analytics-{run_id[:8]}.csv"]))
    assert list(frame["grading_runs"]) == [2, 2, 2]
    assert frame["first_pass_fail_rate"].max() == 1.0
    app.selectbox(key="analytics_measure").set_value("mean_passes_to_fix").run()
    assert not app.exception
    assert app.get("arrow_vega_lite_chart") or app.get("vega_lite_chart")


def _store_graded_run(store: Store, thread_id: str | None, passes: list[bool]) -> str:
    run = store.create_run(prompt="p", rubric="- a", title="cell", thread_id=thread_id)
    for i, passed in enumerate(passes):
        store.add_evaluation(run.run_id, {
            "grading_run_id": f"g-{run.run_id}", "iteration": i,
            "result": "satisfied" if passed else "needs_revision", "explanation": "",
            "status": "satisfied" if passed else "needs_revision", "unverified": False,
            "duration_s": 0.1, "input_tokens": 10, "output_tokens": 2, "answer": str(i),
            "criteria": [{"name": "a", "passed": passed, **({} if passed else {"gap": "x"})}]})
    store.finish_run(run.run_id, "satisfied" if passes[-1] else "max_iterations_reached")
    return str(run.run_id)


def test_loop_analytics_for_an_experiment_with_every_measure_charted(
    app: AppTest, db_path: Path, captured_files: dict[str, bytes]
) -> None:
    from rubric_core.offline.demo_dataset import demo_dataset
    from rubric_core.settings import ExperimentConfig

    with Store(db_path) as store:
        _store_graded_run(store, None, [True])  # same rubric, not in the experiment
        dataset = demo_dataset()
        version = store.save_dataset(dataset)
        exp = store.create_experiment(
            name="trial", dataset_name=dataset.name, dataset_version=version,
            configurations=[ExperimentConfig()], repeats=1,
            row_ids=[r.id for r in dataset.rows[:3]])
        cells = store.experiment_cells(exp.experiment_id)
        for cell, passes in zip(cells[:2], ([False, True], [False, False]), strict=True):
            cell_run = _store_graded_run(store, cell.thread_id, passes)
    app.session_state["filter_origin"] = "all"  # Review lists single runs first
    goto(app, "review")
    assert app.selectbox(key="review_run").value == cell_run  # the newest run
    app.radio(key="analytics_scope").set_value("An experiment").run()
    assert not app.exception, app.exception
    picker = app.selectbox(key=f"analytics_experiment_{cell_run}")
    assert picker.value == exp.experiment_id  # the experiment this run is a cell of
    assert "over 2 run(s)" in _texts(app.caption)  # the cells that ran, not the other run
    frame = pd.read_csv(io.BytesIO(captured_files[f"analytics-{cell_run[:8]}.csv"]))
    row = frame.set_index("criterion").loc["a"]
    assert (row["grading_runs"], row["first_pass_fail_rate"]) == (2, 1.0)
    assert (row["feedback_efficacy"], row["revision_tokens"]) == (0.5, 24.0)
    for measure in sup.CHART_MEASURES:
        app.selectbox(key="analytics_measure").set_value(measure).run()
        assert not app.exception, (measure, app.exception)
        assert app.get("arrow_vega_lite_chart") or app.get("vega_lite_chart")
    app.radio(key="analytics_scope").set_value("All runs of this rubric").run()
    assert "over 3 run(s)" in _texts(app.caption)


def test_loop_analytics_without_experiments_says_so_and_the_page_goes_on(app: AppTest) -> None:
    load_example(app, "haiku")
    run_loop(app)
    goto(app, "review")
    app.radio(key="analytics_scope").set_value("An experiment").run()
    assert not app.exception, app.exception
    assert "No experiments yet" in _texts(app.info)
    assert app.button(key="prepare_export")  # the Export tab after it is still drawn


def test_final_answer_is_labelled_when_the_best_attempt_is_not_the_last(
    app: AppTest, db_path: Path
) -> None:
    with Store(db_path) as store:
        run = store.create_run(RunSettings(prompt="p", rubric="- a\n- b", title="t"))
        passes = [("best draft", [True, False], "needs_revision"),
                  ("worse draft", [False, False], "max_iterations_reached")]
        for i, (answer, verdicts, status) in enumerate(passes):
            store.add_evaluation(run.run_id, {
                "grading_run_id": "g", "iteration": i, "result": "needs_revision",
                "explanation": "", "status": status, "unverified": False, "duration_s": 0.1,
                "input_tokens": None, "output_tokens": None, "answer": answer,
                "criteria": [{"name": n, "passed": v, **({} if v else {"gap": "x"})}
                             for n, v in zip("ab", verdicts, strict=True)]})
        store.finish_run(run.run_id, "max_iterations_reached")
    goto(app, "review")
    expanders = [e.label for e in app.expander]
    assert "Final answer — last attempt (pass 2 of 2) · 0/2 criteria pass" in expanders
    assert "The best attempt (pass 1 of 2) · 1/2 criteria pass" in expanders
    app.session_state["last_run_id"] = run.run_id
    goto(app, "run")
    shown = _texts(app.markdown)
    assert "**Final answer — last attempt (pass 2 of 2)**" in shown
    assert "**The best attempt (pass 1 of 2)**" in shown and "best draft" in shown
    assert session.run_status(store.get_run(run.run_id)) == "max_iterations_reached"


# --------------------------------------------------------------------------- experiments


def _frame_with(at: AppTest, column: str) -> pd.DataFrame:
    """The first dataframe on the page that has this column."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def start_bundled_experiment(at: AppTest, *, configs: int = 1) -> str:
    goto(at, "experiments")
    at.button(key="load_demo_dataset").click().run()
    assert "Bundled dataset 'bundled-demo' is stored as version 1" in _texts(at.success)
    if configs > 1:
        at.number_input(key="exp_config_count").set_value(configs).run()
    button = at.button(key="exp_start")
    assert not button.disabled, _messages(at)
    button.click().run()
    assert not at.exception, at.exception
    assert "Experiment finished" in _texts(at.success), _messages(at)
    return str(at.session_state["exp_pick"])


def open_tab(at: AppTest, label: str) -> AppTest:
    """Open a tab of the Experiments page's results (only the open tab is drawn)."""
    at.session_state["exp_tab"] = label
    at.run()
    assert not at.exception, at.exception
    return at


def test_bundled_dataset_experiment_finishes_satisfied(app: AppTest, db_path: Path) -> None:
    exp_id = start_bundled_experiment(app)
    assert "finished · 24/24 cells ended" in _texts(app.caption)
    open_tab(app, "Summary")
    summary = _frame_with(app, "satisfied_pct")
    assert summary["done"].tolist() == [24] and summary["satisfied_pct"].tolist() == [100.0]
    assert not any("1. demo × rules" in d.value.columns for d in app.dataframe)  # grid closed
    open_tab(app, "Grid")
    grid = _frame_with(app, "1. demo × rules")
    assert len(grid) == 24 and grid["1. demo × rules"].str.startswith("satisfied").all()
    with Store(db_path) as store:
        cells = store.experiment_cells(exp_id)
    assert {c.status for c in cells} == {"satisfied"} and len(cells) == 24
    # Selecting a cell shows its answer in place; "Open in Review" opens its run there.
    app.session_state[f"exp_grid_{exp_id}_False"] = {
        "selection": {"rows": [], "columns": [], "cells": [[2, "1. demo × rules"]]}}
    app.run()
    assert not app.exception, app.exception
    app.button(key="exp_open_1. demo × rules").click().run()
    assert not app.exception, app.exception
    assert app.selectbox(key="review_run").value == cells[2].run.run_id


def test_an_experiment_on_a_server_shares_its_backoff_and_builds_one_model_per_string(
    app: AppTest, db_path: Path
) -> None:
    # The page built its models with only the sync HTTP client going through the shared
    # backoff, streaming, and afresh per cell; cells call models on the experiments' event
    # loop (the async client), so a 429 failed a cell. Now it builds them as the CLI does.
    from rubric_core import runner

    server = DelayedServer(delay_s=0.0, grader_reply=verdict(
        "satisfied", "fine", ["answers the question"]))
    with server.fake:
        server.fake.enqueue(error(429, "slow down"))  # the first call of the experiment
        goto(app, "experiments")
        app.text_area(key="dataset_paste").input(
            "prompt\n" + "".join(f"question {i}\n" for i in range(4))).run()
        app.text_input(key="dataset_name").input("q").run()
        app.button(key="store_dataset").click().run()
        app.text_input(key="base_url").input(server.fake.base_url).run()
        for field in ("worker", "grader"):  # the one OpenAI-compatible model the form offers
            app.selectbox(key=sup.config_key(0, field)).set_value(
                "openai-compatible:llama3.1").run()
        app.text_area(key="exp_rubric").input("- answers the question").run()
        app.number_input(key="exp_concurrency").set_value(2).run()
        agents_before = set(runner._agents)
        button = app.button(key="exp_start")
        assert not button.disabled, _messages(app)
        button.click().run()
        assert not app.exception, app.exception
    assert "Experiment finished" in _texts(app.success), _messages(app)
    with Store(db_path) as store:
        [exp] = store.list_experiments()
        assert {c.status for c in store.experiment_cells(exp.experiment_id)} == {"satisfied"}
    requests, times = server.fake.requests, server.fake.request_times
    assert len(requests) == 1 + 4 * 2  # the 429, then a worker and a grader call per cell
    # The backoff counted the 429 and sent the same request again after its wait (0.5 s).
    [again] = [i for i, body in enumerate(requests) if i and body == requests[0]]
    assert times[again] - times[0] >= 0.45
    assert not any(body.get("stream") for body in server.fake.requests)
    # One worker and one grader model for the configuration: its four cells shared one agent.
    assert len(set(runner._agents) - agents_before) == 1


def test_a_bad_dataset_names_row_and_column_and_stores_nothing(
    app: AppTest, db_path: Path
) -> None:
    goto(app, "experiments")
    app.text_area(key="dataset_paste").input("id,prompt\na,Say hi\nb,\n").run()
    app.text_input(key="dataset_name").input("broken").run()
    app.button(key="store_dataset").click().run()
    assert not app.exception
    assert "Nothing was stored: row 3, column 'prompt': the prompt is empty" in _texts(app.error)
    with Store(db_path) as store:
        assert store.list_datasets() == []
    assert "Datasets (0 stored)" in [e.label for e in app.expander]


def test_a_pasted_dataset_is_stored_previewed_and_deleted(app: AppTest, db_path: Path) -> None:
    goto(app, "experiments")
    app.text_area(key="dataset_paste").input(
        '{"prompt": "Translate {word} into French", "word": "cat"}\n').run()
    app.text_input(key="dataset_name").input("mine").run()
    app.button(key="store_dataset").click().run()
    assert "Stored dataset 'mine' version 1 (1 rows)" in _texts(app.success)
    assert "Translate cat into French" in app.dataframe[1].value["prompt"].tolist()
    # Its prompts are unknown to the demo worker: the form says so before the run.
    assert "knows only the bundled examples" in _texts(app.warning)
    app.button(key="delete_dataset").click().run()
    with Store(db_path) as store:
        assert store.list_datasets() == []


def test_compare_two_configurations_shows_flips(app: AppTest) -> None:
    goto(app, "experiments")
    app.session_state[sup.config_key(1, "cap")] = 1
    app.session_state[sup.config_key(1, "label")] = "one pass"
    start_bundled_experiment(app, configs=2)
    summary = _frame_with(open_tab(app, "Summary"), "satisfied_pct")
    assert summary["configuration"].tolist() == ["demo × rules", "one pass"]
    assert summary["satisfied_pct"].iloc[0] == 100.0 and summary["satisfied_pct"].iloc[1] < 100
    criteria = _frame_with(open_tab(app, "Per criterion"), "final_pass_rate")
    assert set(criteria["config_index"]) == {0, 1}
    flips = _frame_with(open_tab(app, "Compare"), "change")
    assert len(flips) > 0 and set(flips["change"]) == {"pass → fail"}
    text = _texts(app.markdown)
    assert f"{len(flips)} pass → fail, 0 fail → pass. McNemar's exact p =" in text
    assert "equally good" in _texts(app.caption)


def test_a_stopped_experiment_resumes_to_the_end(app: AppTest, db_path: Path) -> None:
    from rubric_core.experiments import create_experiment, run_experiment
    from rubric_core.offline.demo_dataset import demo_dataset
    from rubric_core.settings import ExperimentConfig

    with Store(db_path) as store:
        exp = create_experiment(store, demo_dataset(), [ExperimentConfig()])
        events = run_experiment(store, exp.experiment_id, concurrency=1)
        for event in events:
            if event["type"] == "cell_finished":
                break
        events.close()  # Stop after the first cell
        assert store.get_experiment(exp.experiment_id).status == "stopped"
    goto(app, "experiments")
    assert "stopped ·" in _texts(app.caption)
    assert app.button(key="exp_stop").disabled
    app.button(key="exp_resume").click().run()
    assert not app.exception, app.exception
    assert "finished · 24/24 cells ended" in _texts(app.caption)
    assert app.button(key="exp_resume_after").disabled
    app.run()
    assert app.button(key="exp_resume").disabled and app.button(key="exp_stop").disabled
    with Store(db_path) as store:
        cells = store.experiment_cells(exp.experiment_id)
    assert {c.status for c in cells} == {"satisfied"}


def test_delete_experiment_refuses_while_a_worker_holds_a_cell_then_deletes(
    app: AppTest, db_path: Path
) -> None:
    exp_id = start_bundled_experiment(app)
    with Store(db_path) as store:
        runs = len(store.list_runs(limit=None))
        cell = store.experiment_cells(exp_id)[0]
        store.finish_run(cell.run.run_id, "interrupted")  # as if Stopped, then taken elsewhere
        assert store.claim_run(cell.run.run_id, stale_before=store.now(),
                               owner="other-machine:1:abc")
    app.run()
    assert app.button(key="exp_delete").label == "Delete experiment"
    app.button(key="exp_delete").click().run()
    assert not app.exception, app.exception
    errors = _texts(app.error)
    assert "Not deleted: experiment" in errors and "1 cell(s) are being run" in errors
    with Store(db_path) as store:
        assert store.get_experiment(exp_id) is not None
        store.finish_run(cell.run.run_id, "interrupted", owner="other-machine:1:abc")
    app.button(key="exp_delete").click().run()
    assert not app.exception, app.exception
    assert "its runs stay in Review" in _texts(app.success), _messages(app)
    with Store(db_path) as store:
        assert store.list_experiments() == [] and store.experiment_cells(exp_id) == []
        assert len(store.list_runs(limit=None)) == runs
        store.delete_dataset("bundled-demo")  # no experiment uses it any more
    assert "New experiment" in [e.label for e in app.expander]


def test_align_regrades_labelled_answers_both_ways_and_fills_the_grader_prompt(
    app: AppTest, db_path: Path
) -> None:
    load_example(app, "haiku")
    store = run_loop(app)
    run_id = app.session_state["last_run_id"]
    first = store.evaluations(run_id)[0]["criteria"]
    store.set_label(run_id, 0, first[0]["name"], "ana", agree=False, note="it is not")
    store.set_label(run_id, 1, first[0]["name"], "ana", agree=True)
    goto(app, "review")
    assert "4 grader calls" in _texts(app.caption)
    app.button(key="align_run").click().run()
    assert not app.exception, app.exception
    table = app.session_state["align_result"]
    assert list(table.columns) == ["criterion", "n", "agreement_without", "kappa_without",
                                   "agreement_with", "kappa_with"]
    overall = table.iloc[-1]
    # The rules grader ignores prompts, so the examples change nothing: honest, both ways.
    assert overall["n"] == 2 and overall["agreement_without"] == overall["agreement_with"]
    app.button(key="align_use").click().run()
    prompt = app.session_state["grader_system_prompt"]
    assert "<labelled_examples>" in prompt and "it is not" in prompt


def test_align_uses_only_the_labels_of_the_open_run_s_rubric(app: AppTest) -> None:
    load_example(app, "haiku")
    store = run_loop(app)
    haiku = app.session_state["last_run_id"]
    name = store.evaluations(haiku)[0]["criteria"][0]["name"]
    store.set_label(haiku, 0, name, "ana", agree=False, note="HAIKU-NOTE")
    load_example(app, "photosynthesis")
    run_loop(app)
    summary = app.session_state["last_run_id"]
    name = store.evaluations(summary)[0]["criteria"][0]["name"]
    store.set_label(summary, 0, name, "ana", agree=False, note="SUMMARY-NOTE")
    goto(app, "review")
    assert app.selectbox(key="review_run").value == summary
    assert "2 grader calls" in _texts(app.caption)  # one answer, not both rubrics' answers
    app.button(key="align_run").click().run()
    assert not app.exception, app.exception
    assert app.session_state["align_result"].iloc[-1]["n"] == 1
    app.button(key="align_use").click().run()
    prompt = app.session_state["grader_system_prompt"]
    assert "SUMMARY-NOTE" in prompt and "HAIKU-NOTE" not in prompt
    # The result belongs to that rubric: another rubric's run does not show it.
    app.selectbox(key="review_run").set_value(haiku).run()
    assert not app.exception, app.exception
    assert "align_use" not in [b.key for b in app.button]
    assert "2 grader calls" in _texts(app.caption)


def test_the_sidebars_judging_options_reach_the_run(app: AppTest) -> None:
    load_example(app, "haiku")
    assert app.selectbox(key="consensus").disabled  # nothing to combine with one grading
    app.number_input(key="grader_repeats").set_value(3).run()
    assert not app.selectbox(key="consensus").disabled
    app.selectbox(key="consensus").set_value("unanimous").run()
    app.checkbox(key="return_best").check().run()
    store = run_loop(app)
    run = store.get_run(app.session_state["last_run_id"])
    assert run is not None and run.status == "satisfied"
    assert (run.settings.grader_repeats, run.settings.consensus, run.settings.return_best) == (
        3, "unanimous", True)
    assert {ev.get("repeats") for ev in store.evaluations(run.run_id)} == {3}


def test_the_sidebars_output_limits_reach_the_run(app: AppTest) -> None:
    load_example(app, "haiku")
    assert app.sidebar.number_input(key="worker_max_tokens").value == 0  # the model's default
    app.sidebar.number_input(key="worker_max_tokens").set_value(512).run()
    app.sidebar.number_input(key="grader_max_tokens").set_value(256).run()
    store = run_loop(app)
    run = store.get_run(app.session_state["last_run_id"])
    assert run is not None and run.status == "satisfied"
    assert (run.settings.worker_max_tokens, run.settings.grader_max_tokens) == (512, 256)


def test_an_experiment_configuration_carries_its_judging_options(app: AppTest,
                                                                 db_path: Path) -> None:
    goto(app, "experiments")
    app.button(key="load_demo_dataset").click().run()
    assert app.selectbox(key=sup.config_key(0, "consensus")).disabled
    app.number_input(key=sup.config_key(0, "repeats")).set_value(2).run()
    app.checkbox(key=sup.config_key(0, "best")).check().run()
    app.button(key="exp_start").click().run()
    assert not app.exception, app.exception
    exp_id = str(app.session_state["exp_pick"])
    with Store(db_path) as store:
        exp = store.get_experiment(exp_id)
        assert exp is not None
        [config] = exp.configurations
        assert (config.grader_repeats, config.return_best) == (2, True)
        cell = store.experiment_cells(exp_id)[0]
        assert cell.run is not None
        assert {ev.get("repeats") for ev in store.evaluations(cell.run.run_id)} == {2}


@pytest.mark.parametrize("value", [
    pytest.param(99, id="too_many"),
    pytest.param(0, id="zero"),
    pytest.param(2.5, id="not_whole"),
])
def test_tampered_grader_repeats_never_reach_a_run(
    app: AppTest, db_path: Path, value: float
) -> None:
    # A hostile client can send the server any number for a number widget: the page must not
    # crash, and no run may grade outside 1-9 times (Streamlit puts the widget's value back in
    # bounds; `check_form` would refuse it otherwise, see test_app_support).
    load_example(app, "haiku")
    app.session_state["grader_repeats"] = value
    goto(app, "run")
    assert not app.exception, app.exception
    if not app.button(key="run_button").disabled:
        app.button(key="run_button").click().run()
        assert not app.exception, app.exception
    with Store(db_path) as store:
        repeats = [r.settings.grader_repeats for r in store.list_runs()]
    assert all(isinstance(n, int) and 1 <= n <= 9 for n in repeats), repeats


# --------------------------------------------------------------------------- call traces


def test_calls_and_cached_tokens_are_recorded_and_shown(
        db_path: Path, monkeypatch: pytest.MonkeyPatch,
        captured_files: dict[str, bytes]) -> None:
    from openai_server import CachingOpenAI

    from rubric_core.export import JSON_COLUMNS

    graded: list[int] = []

    def respond(body: dict[str, Any]) -> Any:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        if "GraderResponse" not in names:
            return text(f"draft {len(graded) + 1}")
        graded.append(1)
        return verdict("satisfied") if len(graded) > 1 else verdict("needs_revision", ("c2",))

    monkeypatch.setenv(sup.TOKEN_DELAY_ENV, "0")
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    with CachingOpenAI(default=respond) as server:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
        at.session_state["db_path"] = str(db_path)
        at.session_state["prompt"] = "Write a note. " + "Context kept the same. " * 60
        at.session_state["rubric_text"] = "- c1\n- c2"
        at.run()
        at.sidebar.text_input(key="base_url").input(server.base_url).run()
        for role in ("worker_model", "grader_model"):
            at.sidebar.selectbox(key=role).set_value("openai-compatible:llama3.1").run()
        store = run_loop(at)
        run_id = at.session_state["last_run_id"]
        record = store.get_run(run_id)
        assert record is not None and record.status == "satisfied", _messages(at)
        calls = store.calls(run_id)
        assert [(c["role"], c["iteration"]) for c in calls] == [
            ("worker", 0), ("grader", 0), ("worker", 1), ("grader", 1)]
        assert [c["cached_input_tokens"] for c in calls] == server.cached
        cached = calls[3]["cached_input_tokens"]
        assert cached > 0 and record.cached_input_tokens == cached
        assert [e["cached_input_tokens"] for e in store.evaluations(run_id)] == [0, cached]
        # Visible on the Run page (its Calls view and the run's tokens) ...
        shown = _texts(at.caption)
        assert f"({cached:,} read from the provider's prompt cache)" in shown
        assert "4 call(s): 2 worker, 2 grader" in shown
        table = next(d.value for d in at.dataframe if "Cached in" in d.value.columns)
        assert list(table["Cached in"]) == server.cached and list(table["Pass"]) == [1, 1, 2, 2]
        # ... and in Review, where a selected call's messages and reply are readable.
        goto(at, "review")
        assert f"({cached:,} read from the provider's prompt cache)" in _texts(at.caption)
        at.selectbox(key=f"review_call_{run_id}").set_value(3).run()
        assert "grader · llama3.1" in _texts(at.caption)
        assert "GraderResponse" in _texts(at.markdown) + _texts(at.text)
        records = json.loads(captured_files[f"run-{run_id[:8]}.json"])
        assert set(records[0]) == set(JSON_COLUMNS)
        exported = [c for r in records for c in (r["calls"] or [])]
        assert [c["cached_input_tokens"] for c in exported] == server.cached
        csv = pd.read_csv(io.BytesIO(captured_files[f"run-{run_id[:8]}.csv"]))
        assert list(csv.columns)[-3:] == ["cached_input_tokens", "pass_cost_usd",
                                          "criterion_cost_usd"] and "calls" not in csv.columns
        assert sorted(set(csv["cached_input_tokens"])) == [0, cached]
