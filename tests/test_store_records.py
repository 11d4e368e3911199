"""The store's records and row mappers: one source for a run's settings, rows read by name."""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING, Any

import pytest

from rubric_core.settings import RunSettings
from rubric_core.store import RunRecord, Store
from rubric_core.store._library import versioned_row
from rubric_core.store._records import RUN_COLUMNS, run_from_row, run_to_row

if TYPE_CHECKING:
    from pathlib import Path

_DERIVED = ("title", "prompt", "rubric", "worker_model", "grader_model", "max_iterations",
            "worker_system_prompt", "grader_system_prompt", "grader_tools")
_LIFECYCLE: dict[str, Any] = {
    "run_id": "r1", "thread_id": "t1", "status": "satisfied",
    "created_at": "2026-01-01T00:00:00+00:00", "updated_at": "2026-01-01T00:00:01+00:00",
    "duration_s": 1.0, "iterations": 1, "input_tokens": 3, "output_tokens": 4, "error": None,
}


def test_a_run_s_settings_are_the_one_source_of_its_columns() -> None:
    settings = RunSettings(prompt="p", rubric="- a", title="t", worker_system_prompt="w",
                           grader_tools=("text_stats",), max_iterations=4)
    run = RunRecord(**_LIFECYCLE, settings=settings)
    assert {name: getattr(run, name) for name in _DERIVED} == {
        name: getattr(settings, name) for name in _DERIVED}
    # Replacing the settings changes what the record says: no stale copy is kept beside them.
    other = dataclasses.replace(run, settings=settings.replace(title="new", rubric="- b"))
    assert (other.title, other.rubric, other.prompt) == ("new", "- b", "p")
    assert other != run and dataclasses.replace(run) == run
    with pytest.raises(TypeError, match="settings or its columns, not both"):
        RunRecord(**_LIFECYCLE, settings=settings, title="t")


@pytest.mark.parametrize(
    ("prompts", "recorded"),
    [
        pytest.param({}, False, id="schema_1_row_records_no_prompts_or_tools"),
        pytest.param({"worker_system_prompt": "", "grader_system_prompt": "s",
                      "grader_tools": ()}, True, id="schema_2_row_records_them"),
    ],
)
def test_a_record_built_from_columns_derives_its_settings(
    prompts: dict[str, Any], recorded: bool
) -> None:
    run = RunRecord(**_LIFECYCLE, title="t", prompt="p", rubric="- a", worker_model="w",
                    grader_model="g", max_iterations=2, **prompts)
    assert run.settings.prompt == "p" and run.settings.max_iterations == 2
    assert run.prompts_recorded is recorded
    shown = (run.worker_system_prompt, run.grader_system_prompt, run.grader_tools)
    assert shown == (("", "s", ()) if recorded else (None, None, None))


def test_rows_are_read_by_column_name_in_any_order(tmp_path: Path) -> None:
    with Store(tmp_path / "db.sqlite3") as store:
        run = store.create_run(prompt="p", rubric="- a", grader_tools=["text_stats"], owner="o")
        stored = store.get_run(run.run_id)
    row = run_to_row(run)
    assert set(row) == set(RUN_COLUMNS)
    shuffled = list(row.items())
    random.Random(7).shuffle(shuffled)
    assert run_from_row(dict(shuffled), run.observed_at) == run == stored
    # A row stored before schema 3 (no settings_json) is read from its columns.
    legacy = run_from_row({**row, "settings_json": None})
    assert legacy.settings.grader_tools == ("text_stats",) and legacy.prompts_recorded


def test_one_query_reads_version_n_or_the_latest(db_location: str | Path) -> None:
    from rubric_core.datasets import parse_dataset

    with Store(db_location) as store:
        assert store.save_rubric("r", "- one") == 1
        assert store.save_rubric("r", "- two") == 2
        data = parse_dataset("prompt\nhello\n", name="d.csv")
        assert store.save_dataset(data, "d") == 1
        with store._connect() as conn:
            assert versioned_row(conn, "rubric_versions", "r", None, "text")["text"] == "- two"
            assert versioned_row(conn, "rubric_versions", "r", 1, "version, text")["text"] == (
                "- one")
            assert versioned_row(conn, "rubric_versions", "r", 3, "text") is None
            assert versioned_row(conn, "datasets", "d", None, "version")["version"] == 1
            with pytest.raises(ValueError, match="not a versioned table"):
                versioned_row(conn, "runs", "r", None, "text")
        assert (store.load_rubric("r"), store.load_rubric("r", 1)) == ("- two", "- one")
        with pytest.raises(KeyError, match="no saved rubric 'r' version 3"):
            store.load_rubric("r", 3)
        with pytest.raises(KeyError, match="no stored dataset 'd' version 2"):
            store.load_dataset("d", 2)


def test_the_old_module_still_answers_for_the_names_it_held() -> None:
    import rubric_core.store as store
    from rubric_core.store import _core

    # Store and RunTakenOver are read from rubric_core.store (issue 38: no import cycle).
    for name in ("RunRecord", "CellRecord", "CellOutcome",
                 "DatasetInfo", "ExperimentRecord", "PassVerdicts", "default_db_path",
                 "shown_location", "SCHEMA_VERSION", "StoreError"):
        assert getattr(_core, name) is getattr(store, name), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _core.nope  # noqa: B018
