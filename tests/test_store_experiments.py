"""Datasets and experiments in the store: versions, cells, one transaction each.

Tests taking ``db_location`` or ``store`` (tests/conftest.py) run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlite3
import time
from typing import TYPE_CHECKING, Any

import pytest
from pg_support import database_holds, scalar

from rubric_core.datasets import DatasetError, parse_dataset
from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.settings import ExperimentConfig
from rubric_core.store import SCHEMA_VERSION, Store

if TYPE_CHECKING:
    from pathlib import Path

CSV = "id,prompt,topic\na,Write about {topic},cats\nb,Write about {topic},dogs\n"


def _count(location: str | Path, table: str) -> int:
    return int(str(scalar(location, f"SELECT COUNT(*) FROM {table}")))


def test_dataset_versions_round_trip(db_location: str | Path) -> None:
    with Store(db_location) as store:
        ds = parse_dataset(CSV, name="pets")
        assert store.save_dataset(ds) == 1
        assert store.save_dataset(ds) == 1  # unchanged rows: no new version
        changed = parse_dataset(CSV.replace("dogs", "owls"), name="pets")
        assert store.save_dataset(changed) == 2
        loaded, version = store.load_dataset("pets")
        assert version == 2 and loaded.rows == changed.rows and loaded.columns == ds.columns
        assert store.load_dataset("pets", 1)[0].rows == ds.rows
        [info] = store.list_datasets()
        assert (info.name, info.version, info.row_count) == ("pets", 2, 2)
        assert [v.version for v in store.dataset_versions("pets")] == [1, 2]
        with pytest.raises(KeyError, match="no stored dataset 'nope'"):
            store.load_dataset("nope")
        assert store.delete_dataset("pets") == 2
        assert store.list_datasets() == []


def test_bad_dataset_stores_nothing(db_location: str | Path) -> None:
    path = db_location
    with Store(path) as store:
        store.list_datasets()
        with pytest.raises(DatasetError, match=r"row 3, column 'prompt'"):
            store.save_dataset(parse_dataset("id,prompt\na,hello\nb,\n", name="bad"))
    assert _count(path, "datasets") == 0


def test_experiment_cells_and_their_runs(db_location: str | Path) -> None:
    with Store(db_location) as store:
        ds = demo_dataset()
        version = store.save_dataset(ds)
        configs = (ExperimentConfig(), ExperimentConfig(max_iterations=1, label="one pass"))
        exp = store.create_experiment(name="e", dataset_name=ds.name, dataset_version=version,
                                      configurations=configs, repeats=2,
                                      row_ids=[r.id for r in ds.rows[:3]])
        assert store.get_experiment(exp.experiment_id) == exp
        assert exp.configurations == configs
        cells = store.experiment_cells(exp.experiment_id)
        assert len(cells) == 3 * 2 * 2 and len({c.thread_id for c in cells}) == 12
        assert {c.status for c in cells} == {"pending"}
        first = cells[0]
        run = store.create_run(configs[0].settings_for(ds.rows[0]), thread_id=first.thread_id)
        again = store.experiment_cells(exp.experiment_id)[0]
        assert again.run is not None and again.run.run_id == run.run_id
        assert again.status == "running"
        assert again.run.settings.dataset_row is not None
        assert again.run.settings.dataset_row["kind"] == "haiku"
        new_thread = store.renew_cell_thread(exp.experiment_id, first.key)
        renewed = store.experiment_cells(exp.experiment_id)[0]
        assert renewed.thread_id == new_thread and renewed.run is None
        with pytest.raises(ValueError, match="used by experiment"):
            store.delete_dataset(ds.name)
        store.set_experiment_status(exp.experiment_id, "finished")
        assert store.list_experiments()[0].status == "finished"
        assert store.delete_experiment(exp.experiment_id)
        assert store.experiment_cells(exp.experiment_id) == []
        assert store.get_run(run.run_id) is not None  # runs stay for Review


def test_row_without_rubric_needs_the_configuration_s() -> None:
    ds = parse_dataset(CSV, name="pets")
    with pytest.raises(ValueError, match="row 'a' has no 'rubric'"):
        ExperimentConfig().settings_for(ds.rows[0])
    settings = ExperimentConfig(rubric="- is short").settings_for(ds.rows[0])
    assert settings.rubric == "- is short" and settings.prompt == "Write about cats"
    assert settings.dataset_row == {"id": "a", "prompt": "Write about cats", "rubric": None,
                                    "topic": "cats"}


def test_schema_3_file_gains_the_experiment_tables(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with Store(path) as store:
        run = store.create_run(prompt="p", rubric="- a")
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE experiment_cells; DROP TABLE experiments; DROP TABLE datasets;"
                       "UPDATE meta SET value = '3' WHERE key = 'schema_version';")
    conn.close()
    with Store(path) as store:
        assert store.get_run(run.run_id) == run
        assert store.save_dataset(parse_dataset(CSV, name="pets")) == 1
    conn = sqlite3.connect(path)
    (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == str(SCHEMA_VERSION)


def test_stored_dataset_rows_hold_no_secret(
    db_location: str | Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rubric_core.datasets import parse_dataset

    secret = "sk-realkey-ABCDEFGHIJKLMNOP1234"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    with Store(db_location) as store:
        rows = f'prompt,note\n"my key is {secret}","Bearer abcdefgh12"\n'
        store.save_dataset(parse_dataset(rows, name="d"))
        dataset, _ = store.load_dataset("d")
    assert dataset.rows[0].prompt == "my key is [redacted]"
    assert dataset.rows[0].variables["note"] == "Bearer [redacted]"
    assert database_holds(db_location, secret) == []
    assert database_holds(db_location, "Bearer [redacted]") != []


# -- cells and their runs ------------------------------------------------------------------------

def _experiment(store: Store, rows: int = 3, configs: int = 2) -> str:
    ds = demo_dataset()
    version = store.save_dataset(ds)
    exp = store.create_experiment(
        name="e", dataset_name=ds.name, dataset_version=version,
        configurations=[ExperimentConfig(max_iterations=i + 1) for i in range(configs)],
        repeats=1, row_ids=[r.id for r in ds.rows[:rows]])
    return exp.experiment_id


def _pass(grading_run_id: str, iteration: int, result: str, **passed: bool) -> Any:
    return {"grading_run_id": grading_run_id, "iteration": iteration, "result": result,
            "status": result, "explanation": "e", "answer": "a " * 500, "duration_s": 0.1,
            "input_tokens": 10, "output_tokens": 2, "unverified": False,
            "criteria": [{"name": n, "passed": p} if p else {"name": n, "passed": p, "gap": "g"}
                         for n, p in passed.items()]}


def test_cell_outcomes_read_totals_and_the_last_grading_run(store: Store) -> None:
    exp_id = _experiment(store, rows=2, configs=2)
    cells = store.experiment_cells(exp_id)
    # Cell 0 graded twice: a first grading run of two passes, then one of two more (a retry).
    run = store.create_run(prompt="p", rubric="- a\n- b", thread_id=cells[0].thread_id)
    store.add_evaluation(run.run_id, _pass("g1", 0, "needs_revision", a=False, b=True))
    store.add_evaluation(run.run_id, _pass("g1", 1, "needs_revision", a=False, b=False))
    store.add_evaluation(run.run_id, _pass("g2", 0, "needs_revision", a=False, b=True))
    store.add_evaluation(run.run_id, _pass("g2", 1, "satisfied", a=True, b=True))
    store.finish_run(run.run_id, "satisfied", duration_s=2.5)
    # Cell 2 started but has not graded yet; cells 1 and 3 are pending.
    started = store.create_run(prompt="p", rubric="- a", thread_id=cells[2].thread_id)

    lean = store.cell_outcomes(exp_id)
    assert [c.key for c in lean] == [c.key for c in cells]
    assert [c.status for c in lean] == ["satisfied", "pending", "running", "pending"]
    assert [c.run_id for c in lean] == [run.run_id, None, started.run_id, None]
    first = lean[0]
    assert (first.iterations, first.input_tokens, first.output_tokens, first.duration_s) == (
        4, 40, 8, 2.5)
    assert all(c.passes == () for c in lean)

    full = store.cell_outcomes(exp_id, verdicts=True)
    assert [c.key for c in full] == [c.key for c in cells]
    assert [r for r, _ in full[0].passes] == ["needs_revision", "satisfied"]  # g2 only
    assert [[(v["name"], v["passed"]) for v in verdicts] for _, verdicts in full[0].passes] == [
        [("a", False), ("b", True)], [("a", True), ("b", True)]]
    assert [c.passes for c in full[1:]] == [(), (), ()]
    assert [c._replace(passes=()) for c in full] == lean


def test_experiment_cells_are_read_a_page_at_a_time(store: Store) -> None:
    exp_id = _experiment(store, rows=3, configs=2)
    every = store.experiment_cells(exp_id)
    pages = [store.experiment_cells(exp_id, offset=start, limit=4) for start in (0, 4, 8)]
    assert [len(p) for p in pages] == [4, 2, 0]
    assert [c for p in pages for c in p] == every


def test_an_experiment_whose_cell_is_being_run_is_not_deleted(store: Store) -> None:
    exp_id = _experiment(store, rows=2, configs=1)
    live, dead = store.experiment_cells(exp_id)
    config = ExperimentConfig(max_iterations=1)
    ds = demo_dataset()
    live_run = store.create_run(config.settings_for(ds.rows[0]), thread_id=live.thread_id)
    dead_run = store.create_run(config.settings_for(ds.rows[1]), thread_id=dead.thread_id)
    time.sleep(0.05)
    cutoff = store.now()  # heartbeats before it are a dead process's
    assert store.touch_run(live_run.run_id, owner=live_run.owner)
    with pytest.raises(ValueError, match=r"is running: 2 cell\(s\) are being run"):
        store.delete_experiment(exp_id)  # without a cut-off every running run holds it
    with pytest.raises(ValueError, match=r"is running: 1 cell\(s\) are being run"):
        store.delete_experiment(exp_id, stale_before=cutoff)
    assert len(store.experiment_cells(exp_id)) == 2  # nothing was deleted
    store.finish_run(live_run.run_id, "interrupted", owner=live_run.owner)
    assert store.delete_experiment(exp_id, stale_before=cutoff)
    assert store.get_experiment(exp_id) is None and store.experiment_cells(exp_id) == []
    assert {r.run_id for r in store.list_runs(limit=None)} >= {live_run.run_id, dead_run.run_id}
    assert not store.delete_experiment(exp_id)


def test_a_retried_cells_earlier_run_is_kept_with_its_experiment(store: Store) -> None:
    from rubric_core import session
    from rubric_core.experiments import create_experiment, retry_cell

    config = ExperimentConfig(rubric="- The answer is about a pet")
    experiment = create_experiment(store, parse_dataset(CSV, name="pets"), [config])
    first, pending = store.experiment_cells(experiment.experiment_id)
    row = store.load_dataset("pets")[0].rows[0]
    run = session.start(store, config.settings_for(row), thread_id=first.thread_id)
    for _ in run:
        pass
    assert store.earlier_cell_runs(experiment.experiment_id) == []  # it is the cell's run
    thread = retry_cell(store, experiment.experiment_id, first.key)
    # The other cell has no run yet: that must not hide the earlier run (a NULL in NOT IN).
    [earlier] = store.earlier_cell_runs(experiment.experiment_id)
    assert (earlier.run_id, earlier.row_id, earlier.config_index, earlier.repeat_index) == (
        run.run_id, "a", 0, 0)
    assert earlier.iterations >= 1
    assert store.experiment_cells(experiment.experiment_id)[0].thread_id == thread
    assert pending.run is None
    assert set(store.experiment_call_usage(experiment.experiment_id)) == {run.run_id}
    with pytest.raises(KeyError, match="no cell"):
        retry_cell(store, experiment.experiment_id, ("zz", 0, 0))
    assert store.delete_experiment(experiment.experiment_id)
    assert store.earlier_cell_runs(experiment.experiment_id) == []
