"""Datasets and experiments in the store: versions, cells, one transaction each, leases.

Tests taking ``db_location`` or ``store`` (tests/conftest.py) run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

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


def test_schema_version_is_six() -> None:
    assert SCHEMA_VERSION == 6


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
