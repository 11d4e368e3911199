"""The lab's tables: an older database gains them in place, a copy carries them, configurations
are appended (never changed), lean progress reads, and deleting what a re-grade uses is refused."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

import pytest

from rubric_core.lab import (
    GraderConfig,
    add_config,
    bundled_answer_set,
    create_regrade,
    job_progress,
    run_regrade,
)
from rubric_core.store import SCHEMA_VERSION, Store, copy_store

if TYPE_CHECKING:
    from pathlib import Path

LAB_TABLES = ("answer_sets", "answer_items", "answer_labels", "regrade_jobs", "regrade_results")


def test_a_schema_7_file_gains_the_lab_tables_in_place(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite3"
    with Store(db) as store:
        run = store.create_run(title="t", prompt="p", rubric="- r", worker_model="demo",
                               grader_model="rules", max_iterations=3)
    conn = sqlite3.connect(db)
    for table in reversed(LAB_TABLES):
        conn.execute(f"DROP TABLE {table}")
    conn.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with Store(db) as store:
        assert store.get_run(run.run_id) is not None  # nothing of before is lost
        assert store.save_answer_set(bundled_answer_set()) == 1
    conn = sqlite3.connect(db)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == (str(SCHEMA_VERSION),) and SCHEMA_VERSION >= 8


def test_a_copy_carries_answer_sets_and_regrades(tmp_path: Path, pg_url: str) -> None:
    source = tmp_path / "a.sqlite3"
    with Store(source) as store:
        job = create_regrade(store, bundled_answer_set(), [GraderConfig(rubric="- c")])
        list(run_regrade(store, job.job_id))
    copied = copy_store(source, pg_url)
    assert {t: copied[t] for t in LAB_TABLES} == {
        "answer_sets": 1, "answer_items": 32, "answer_labels": 256, "regrade_jobs": 1,
        "regrade_results": 32}
    with Store(pg_url) as store:
        assert store.regrade_counts(job.job_id) == {0: (32, 0)}


def test_configurations_are_appended_and_progress_read_lean(store: Store) -> None:
    job = create_regrade(store, bundled_answer_set(), [GraderConfig(rubric="- c")])
    list(run_regrade(store, job.job_id))
    index = add_config(store, job.job_id, GraderConfig(rubric="- c\n- d", grader_repeats=2))
    assert index == 1
    stored = store.get_regrade_job(job.job_id)
    assert stored is not None and stored.configurations[0] == GraderConfig(rubric="- c")
    assert [(p["done"], p["total"]) for p in job_progress(store, job.job_id)] == [
        (32, 32), (0, 64)]
    with pytest.raises(ValueError, match="used by re-grade"):
        store.delete_answer_set("bundled")
    assert store.delete_regrade_job(job.job_id) and store.delete_answer_set("bundled") == 1


def test_a_configuration_that_cannot_grade_stores_nothing(store: Store) -> None:
    with pytest.raises(ValueError, match="Grader tool 'nope' is not available"):
        create_regrade(store, bundled_answer_set(), [GraderConfig(rubric="- c",
                                                                  grader_tools=("nope",))])
    with pytest.raises(ValueError, match="no criteria"):
        create_regrade(store, bundled_answer_set(), [GraderConfig(rubric="   ")])
    assert store.list_answer_sets() == [] and store.list_regrade_jobs() == []
