"""Head to head in the app (AppTest): from Review (two passes, two runs) and Experiments (two
configurations), judged with the sidebar's grader in both orders, stored, listed, exported."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest

from rubric_core import app_support as sup
from rubric_core.datasets import parse_dataset
from rubric_core.experiments import create_experiment
from rubric_core.pairwise import CSV_COLUMNS
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    from rubric_core.types import RubricEvaluation

ROOT = Path(__file__).resolve().parents[1]
RUBRIC = "- The poem has three lines\n- The theme is spring"
GOOD = "Spring rain on the hill\ngreen buds open in warm light\nbirds sing by the pond"
BAD = "Autumn leaves fall"


@pytest.fixture(autouse=True)
def navigation_routing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every AppTest run goes through app.py's st.navigation (see tests/test_app.py)."""

    class _Pages(PagesManager):
        pass

    monkeypatch.setattr(PagesManager, "uses_pages_directory", False)
    monkeypatch.setattr("streamlit.testing.v1.app_test.PagesManager", _Pages)


@pytest.fixture
def captured_files(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """Every download button's bytes by file name."""
    files: dict[str, bytes] = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def capture(self: Any, data: Any, mimetype: str, kind: Any, filename: str | None = None
                ) -> str:
        if filename and isinstance(data, bytes):
            files[filename] = data
        return original(self, data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", capture)
    return files


def _evaluation(iteration: int, answer: str) -> RubricEvaluation:
    return {"grading_run_id": "g", "iteration": iteration, "result": "satisfied",
            "explanation": "ok", "criteria": [{"name": "The poem has three lines",
                                               "passed": True}],
            "status": "satisfied", "unverified": False, "duration_s": 0.1, "input_tokens": None,
            "output_tokens": None, "answer": answer}


def _run(store: Store, answers: list[str], *, thread_id: str | None = None,
         title: str = "haiku") -> str:
    record = store.create_run(title=title, prompt="Write a haiku about spring.", rubric=RUBRIC,
                              worker_model="demo", grader_model="rules", max_iterations=3,
                              thread_id=thread_id)
    for i, answer in enumerate(answers):
        store.add_evaluation(record.run_id, _evaluation(i, answer))
    store.finish_run(record.run_id, "satisfied")
    return record.run_id


def _app(db: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(sup.TOKEN_DELAY_ENV, "0")
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db)
    at.run()
    assert not at.exception, at.exception
    return at


def _texts(elements: Any) -> str:
    return "\n".join(str(e.value) for e in elements)


def _frame(at: AppTest, column: str) -> Any:
    """The first table drawn with this column (a table without a selection has no key)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _csv_rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode("utf-8"))))


def test_review_judges_two_passes_head_to_head_and_exports_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        captured_files: dict[str, bytes]) -> None:
    db = tmp_path / "db.sqlite3"
    with Store(db) as store:
        run_id = _run(store, [BAD, GOOD])
    at = _app(db, monkeypatch)
    at.switch_page("pages/review.py").run()
    assert not at.exception, at.exception
    assert "A = pass 1 · B = pass 2" in _texts(at.caption)
    at.button(key="review_h2h_judge").click().run()
    assert not at.exception, at.exception
    assert "Judged 1 pair(s) in both orders with rules." in _texts(at.success)
    shown = _texts(at.markdown)
    assert "**A** = pass 1 · **B** = pass 2" in shown and "flip rate 0.00" in shown
    tally = _frame(at, "Flip rate")
    assert list(tally["B wins"]) == [1, 1, 2] and list(tally["Flip rate"]) == [0.0] * 3
    reasons = _frame(at, "reason_a_first")
    assert list(reasons["result"]) == ["b", "b"]
    assert "shown second passes" in reasons["reason_a_first"].iloc[0]
    with Store(db) as store:
        [record] = store.list_pairwise()
        assert (record.source, record.label_a, record.label_b) == ("review", "pass 1", "pass 2")
        assert len(store.pairwise_calls(record.judgement_id)[0]) == 2
    rows = _csv_rows(captured_files[f"head-to-head-{record.judgement_id[:8]}.csv"])
    assert tuple(rows[0]) == CSV_COLUMNS and [r["winner"] for r in rows] == ["b", "b"]
    listed = _csv_rows(captured_files["head-to-head.csv"])
    assert [r["A"] for r in listed] == ["pass 1"]
    assert run_id  # the run stays as it was


def test_review_judges_the_final_answers_of_two_runs(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "db.sqlite3"
    with Store(db) as store:
        _run(store, [BAD], title="first")
        _run(store, [GOOD], title="second")  # the newest run is the one Review opens
    at = _app(db, monkeypatch)
    at.switch_page("pages/review.py").run()
    at.radio(key="cmp_mode").set_value("Final answers of two runs").run()
    at.button(key="review_h2h_judge").click().run()
    assert not at.exception, at.exception
    assert list(_frame(at, "reason_a_first")["result"]) == ["a", "a"]


def test_experiments_judges_two_configurations_on_every_row_both_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "db.sqlite3"
    with Store(db) as store:
        dataset = parse_dataset("id,prompt\nr1,Write a haiku about spring.\nr2,Another.\n"
                                "r3,A third.\n", name="haikus")
        configs = [ExperimentConfig(label="base", rubric=RUBRIC),
                   ExperimentConfig(label="new", rubric=RUBRIC)]
        experiment = create_experiment(store, dataset, configs)
        answers = {("r1", 0): BAD, ("r1", 1): GOOD, ("r2", 0): GOOD, ("r2", 1): GOOD,
                   ("r3", 0): GOOD}  # r3 has not ended under "new"
        for cell in store.experiment_cells(experiment.experiment_id):
            if (cell.row_id, cell.config_index) in answers:
                _run(store, [answers[(cell.row_id, cell.config_index)]],
                     thread_id=cell.thread_id)
    at = _app(db, monkeypatch)
    at.switch_page("pages/experiments.py").run()
    at.session_state["exp_tab"] = "Compare"
    at.run()
    assert not at.exception, at.exception
    assert "4 grader call(s) for 2 pair(s)" in _texts(at.caption)
    at.button(key="exp_h2h_judge").click().run()
    assert not at.exception, at.exception
    reasons = _frame(at, "reason_a_first")
    assert list(zip(reasons["pair"], reasons["result"], strict=True)) == [
        ("r1", "b"), ("r1", "b"), ("r2", "tie"), ("r2", "tie")]
    with Store(db) as store:
        [record] = store.list_pairwise()
        assert (record.source, record.label_a, record.label_b, record.pairs) == (
            "experiment", "1. base", "2. new", 2)
