"""`rubric-studio db copy`: a whole database, SQLite → PostgreSQL and back, through the CLI.

A database is filled through the public API (runs with evaluations, labels and checkpoints, a
rubric with versions, a dataset, an experiment with a cell's run), copied, and read back
through a `Store` on the copy: everything the app shows must be there, equal.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import pytest
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from rubric_core.cli import main
from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.settings import ExperimentConfig, RunSettings
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path


class _State(TypedDict):
    n: int


def _graph(store: Store) -> Any:
    builder = StateGraph(_State)
    builder.add_node("inc", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "inc")
    builder.add_edge("inc", END)
    return builder.compile(checkpointer=store.saver())


def _fill(location: str | Path) -> None:
    with Store(location) as store:
        graph = _graph(store)
        for i in range(3):
            run = store.create_run(RunSettings(title=f"run {i} · Straße", prompt="p",
                                               rubric="- a\n- b"))
            for step in range(2):
                graph.invoke({"n": step}, {"configurable": {"thread_id": run.thread_id}})
            store.add_evaluation(run.run_id, {
                "grading_run_id": "g", "iteration": 0, "result": "satisfied",
                "explanation": "ok", "status": "satisfied", "unverified": False,
                "duration_s": 0.1, "input_tokens": 3, "output_tokens": None, "answer": "x",
                "cached_input_tokens": 2,
                "criteria": [{"name": "a", "passed": True}, {"name": "b", "passed": True}]})
            store.add_calls(run.run_id, [{
                "call_id": f"call-{i}", "role": "grader", "iteration": 0, "grading_run_id": "g",
                "attempt": 0, "provider": "openai", "model": "gpt-x", "status": "ok",
                "error": None, "started_at": "2026-12-05T10:00:00.000000+00:00",
                "latency_s": 0.25, "first_token_s": None, "input_tokens": 3,
                "cached_input_tokens": 2, "cache_creation_tokens": 0, "output_tokens": 1,
                "http_retries": 0, "messages": [{"role": "human", "text": "Straße"}],
                "messages_total": 1, "reply": {"role": "ai", "text": "ok"}, "tools": [],
                "content_kept": True}])
            store.set_label(run.run_id, 0, "a", "ana", agree=True, note=f"note {i}")
        store.save_rubric_version("r", "- a", settings=RunSettings(prompt="q", rubric="- a"))
        store.save_rubric("r", "- a\n- b")
        ds = demo_dataset()
        version = store.save_dataset(ds)
        exp = store.create_experiment(name="e", dataset_name=ds.name, dataset_version=version,
                                      configurations=[ExperimentConfig()], repeats=1,
                                      row_ids=[r.id for r in ds.rows[:2]])
        cell = store.experiment_cells(exp.experiment_id)[0]
        store.create_run(ExperimentConfig().settings_for(ds.rows[0]), thread_id=cell.thread_id)


def _view(location: str | Path) -> dict[str, Any]:
    """What the app reads from a database, in a form two backends can compare."""
    with Store(location) as store:
        runs = store.list_runs(limit=None)
        saver = store.saver()
        states = {r.thread_id: [(c.checkpoint["channel_values"], c.metadata.get("step"))
                                for c in saver.list({"configurable": {"thread_id": r.thread_id}})]
                  for r in runs}
        experiments = store.list_experiments()
        return {
            "runs": runs, "search": [r.run_id for r in store.list_runs(text="STRASSE")],
            "evaluations": store.evaluations_for_runs(r.run_id for r in runs),
            "calls": store.calls_for_runs(r.run_id for r in runs),
            "labels": store.labels(), "rubrics": store.list_rubrics(),
            "versions": store.rubric_versions("r"), "preset": store.load_preset("r", 1),
            "datasets": store.list_datasets(), "dataset": store.load_dataset(demo_dataset().name),
            "experiments": experiments,
            "cells": [store.experiment_cells(e.experiment_id) for e in experiments],
            "states": states,
        }


def _copy(source: str | Path, destination: str | Path, *extra: str) -> tuple[int, str, str]:
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        err = io.StringIO()
        mp.setattr("sys.stderr", err)
        code = main(["db", "copy", "--from", str(source), "--to", str(destination), *extra], out)
    return code, out.getvalue(), err.getvalue()


def test_sqlite_to_postgresql_and_back_keeps_everything(tmp_path: Path, pg_url: str) -> None:
    original = tmp_path / "original.sqlite3"
    _fill(original)
    code, out, err = _copy(original, pg_url)
    assert code == 0, err
    assert "runs" in out and "checkpoints" in out
    counts = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()[1:]}
    assert counts["runs"] == 4 and counts["evaluations"] == 3 and counts["labels"] == 3
    assert counts["model_calls"] == 3
    assert counts["experiment_cells"] == 2 and counts["checkpoints"] > 6
    assert _view(pg_url) == _view(original)
    back = tmp_path / "back.sqlite3"
    code, out, err = _copy(pg_url, back)
    assert code == 0, err
    assert _view(back) == _view(original)
    # The copy is a working store: its runs' threads continue from their checkpoints.
    with Store(back) as store:
        [run] = store.list_runs(text="run 2")
        state = _graph(store).get_state({"configurable": {"thread_id": run.thread_id}})
        assert state.values == {"n": 2}


def test_a_nonempty_destination_is_refused_unless_asked(tmp_path: Path, pg_url: str) -> None:
    source = tmp_path / "s.sqlite3"
    _fill(source)
    with Store(pg_url) as store:
        kept = store.create_run(prompt="already here", rubric="- a")
    code, _, err = _copy(source, pg_url)
    assert code == 2 and "already holds data (1 runs)" in err and "--into-nonempty" in err
    with Store(pg_url) as store:
        assert [r.run_id for r in store.list_runs()] == [kept.run_id]  # nothing was written
    code, _, err = _copy(source, pg_url, "--into-nonempty")
    assert code == 0, err
    with Store(pg_url) as store:
        assert store.count_runs() == 5 and store.get_run(kept.run_id) == kept


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["db", "copy", "--to", "x.sqlite3"], id="no_source"),
        pytest.param(["db"], id="no_action"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv, io.StringIO())
    assert info.value.code == 2


def test_missing_source_or_same_database_exit_2(tmp_path: Path) -> None:
    code, _, err = _copy(tmp_path / "nope.sqlite3", tmp_path / "d.sqlite3")
    assert code == 2 and "does not exist" in err
    assert not (tmp_path / "d.sqlite3").exists()
    _fill(tmp_path / "a.sqlite3")
    code, _, err = _copy(tmp_path / "a.sqlite3", tmp_path / "." / "a.sqlite3")
    assert code == 2 and "the same database" in err


def test_the_password_is_not_printed(tmp_path: Path) -> None:
    _fill(tmp_path / "a.sqlite3")
    code, out, err = _copy(tmp_path / "a.sqlite3",
                           "postgresql://u:Sup3r-Secret-pw@127.0.0.1:1/db")
    assert code == 2 and "Sup3r-Secret-pw" not in out + err and "u:***@127.0.0.1:1" in err


def test_a_copy_cut_short_says_how_to_finish_it(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rubric_core.store import StoreError
    from rubric_core.store._pg_saver import RedactingPostgresSaver

    source = tmp_path / "s.sqlite3"
    _fill(source)
    real, calls = RedactingPostgresSaver.put, []

    def put_then_fail(self: Any, *args: Any) -> Any:
        calls.append(1)
        if len(calls) > 3:  # the server goes away after three checkpoints
            msg = "Lost the connection to the PostgreSQL server."
            raise StoreError(msg)
        return real(self, *args)

    monkeypatch.setattr(RedactingPostgresSaver, "put", put_then_fail)
    code, _, err = _copy(source, pg_url)
    assert code == 2 and "Lost the connection" in err
    assert "holds a partial copy" in err and "--into-nonempty" in err
    monkeypatch.undo()
    code, _, err = _copy(source, pg_url, "--into-nonempty")
    assert code == 0, err
    assert _view(pg_url) == _view(source)


def test_a_destination_that_is_someone_else_s_is_refused_untouched(
    tmp_path: Path, pg_url: str
) -> None:
    import psycopg

    source = tmp_path / "s.sqlite3"
    _fill(source)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id int PRIMARY KEY, total int)")
        conn.execute("INSERT INTO invoices VALUES (1, 42)")
    code, _, err = _copy(source, pg_url)
    assert code == 2 and "not a Rubric Studio database" in err and "'invoices'" in err
    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r'")]
        assert tables == ["invoices"]
        assert conn.execute("SELECT total FROM invoices").fetchall() == [(42,)]
