"""Tests for rubric_core.store: run index, rubric library, saver, and refusing bad files.

Tests taking ``store`` or ``db_location`` (tests/conftest.py) run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired

import pytest
from langgraph.graph import END, START, StateGraph
from pg_support import database_holds, scalar
from typing_extensions import TypedDict

from rubric_core.settings import RunSettings
from rubric_core.store import (
    APPLICATION_ID,
    DB_ENV_VAR,
    SCHEMA_VERSION,
    RunRecord,
    Store,
    StoreError,
    default_db_path,
)
from rubric_core.store._sqlite import SqliteBackend

if TYPE_CHECKING:

    from rubric_core.types import RubricEvaluation


def _evaluation(iteration: int, passed: list[bool], **extra: Any) -> RubricEvaluation:
    criteria: list[dict[str, Any]] = []
    for i, ok in enumerate(passed):
        c: dict[str, Any] = {"name": f"criterion {i}", "passed": ok}
        if not ok:
            c["gap"] = f"fix {i}"
        criteria.append(c)
    ev: dict[str, Any] = {
        "grading_run_id": "g1",
        "iteration": iteration,
        "result": "satisfied" if all(passed) else "needs_revision",
        "explanation": "ok" if all(passed) else "not yet",
        "criteria": criteria,
        "status": "satisfied" if all(passed) else "needs_revision",
        "unverified": False,
        "duration_s": 0.25 + iteration,
        "input_tokens": 100,
        "output_tokens": 20,
        "answer": f"answer {iteration} — ünïcode",
    }
    ev.update(extra)
    return ev  # type: ignore[return-value]


def _new_run(store: Store, **overrides: Any) -> RunRecord:
    fields: dict[str, Any] = {
        "title": "Essay", "prompt": "Write an essay", "rubric": "- has a title\n- cites a source",
        "worker_model": "fake:worker", "grader_model": "fake:grader", "max_iterations": 3,
    }
    fields.update(overrides)
    return store.create_run(**fields)


# -- default path -------------------------------------------------------------------------------


def test_default_path_prefers_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(DB_ENV_VAR, str(tmp_path / "x.sqlite3"))
    assert default_db_path() == tmp_path / "x.sqlite3"


def test_default_path_respects_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(DB_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_db_path() == tmp_path / "rubric-studio" / "rubric_studio.sqlite3"


def test_default_path_ignores_relative_xdg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DB_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")
    expected = Path.home() / ".local" / "share" / "rubric-studio" / "rubric_studio.sqlite3"
    assert default_db_path() == expected


def test_open_creates_parent_dirs_and_schema(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "db.sqlite3"
    with Store(path):
        pass
    assert path.is_file()
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
    conn.close()
    assert {"meta", "runs", "evaluations", "rubrics", "rubric_versions"} <= tables
    assert meta["app"] == "rubric-studio"
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert mode == "wal"


def test_reopening_keeps_data(db_location: str | Path) -> None:
    with Store(db_location) as first:
        run = _new_run(first)
    with Store(db_location) as second:
        assert second.get_run(run.run_id) == run


# -- runs ---------------------------------------------------------------------------------------


def test_create_and_get_run(store: Store) -> None:
    run = _new_run(store)
    assert len(run.run_id) == 32
    assert run.thread_id == run.run_id
    assert run.status == "running"
    assert run.iterations == 0
    assert run.input_tokens is None
    assert store.get_run(run.run_id) == run
    assert store.get_run("missing") is None


def test_run_keeps_its_prompts_and_grader_tools(store: Store) -> None:
    run = _new_run(store, worker_system_prompt="Be brief. ✓", grader_system_prompt="",
                   grader_tools=["run_python_tests", "text_stats"])
    stored = store.get_run(run.run_id)
    assert stored == run
    assert stored.worker_system_prompt == "Be brief. ✓"
    assert stored.grader_tools == ("run_python_tests", "text_stats")
    assert store.list_runs()[0].grader_tools == ("run_python_tests", "text_stats")


def test_version_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('app', 'rubric-studio'), ('schema_version', '1'),
                                ('created_at', '2026-01-01T00:00:00+00:00');
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, title TEXT NOT NULL,
            prompt TEXT NOT NULL, rubric TEXT NOT NULL, worker_model TEXT NOT NULL,
            grader_model TEXT NOT NULL, max_iterations INTEGER NOT NULL, status TEXT NOT NULL,
            created_at TEXT NOT NULL, updated_at TEXT NOT NULL, duration_s REAL,
            iterations INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER, output_tokens INTEGER,
            error TEXT);
        INSERT INTO runs VALUES ('old', 'old', 'Old run', 'p', '- a', 'demo', 'rules', 3,
            'satisfied', '2026-01-01T00:00:00+00:00', '2026-01-01T00:00:00+00:00', 1.5, 2,
            NULL, NULL, NULL);
    """)
    conn.close()
    with Store(path) as store:
        old = store.get_run("old")
        assert old is not None and old.title == "Old run" and old.iterations == 2
        assert (old.worker_system_prompt, old.grader_system_prompt, old.grader_tools) == (
            None, None, None)
        new = _new_run(store, grader_tools=["text_stats"])
        assert store.get_run(new.run_id) == new
    conn = sqlite3.connect(path)
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    (application_id,) = conn.execute("PRAGMA application_id").fetchone()
    conn.close()
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert meta["created_at"] == "2026-01-01T00:00:00+00:00"
    assert application_id == APPLICATION_ID


def test_create_run_with_explicit_thread(store: Store) -> None:
    assert _new_run(store, thread_id="t-1").thread_id == "t-1"


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"max_iterations": 0}, id="zero_iterations"),
        pytest.param({"max_iterations": True}, id="bool_iterations"),
        pytest.param({"worker_model": " "}, id="blank_worker_model"),
    ],
)
def test_create_run_rejects_bad_fields(store: Store, overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _new_run(store, **overrides)


def test_create_run_accepts_explicit_fields_only(store: Store) -> None:
    with pytest.raises(TypeError):
        _new_run(store, api_key="sk-nope")


def test_add_evaluation_updates_totals(store: Store) -> None:
    run = _new_run(store)
    assert store.add_evaluation(run.run_id, _evaluation(0, [True, False])) == 0
    assert store.add_evaluation(run.run_id, _evaluation(1, [True, True])) == 1
    updated = store.get_run(run.run_id)
    assert updated is not None
    assert updated.iterations == 2
    assert updated.input_tokens == 200
    assert updated.output_tokens == 40
    assert updated.status == "satisfied"
    assert updated.updated_at >= run.updated_at


def test_tokens_stay_none_when_never_reported(store: Store) -> None:
    run = _new_run(store)
    store.add_evaluation(run.run_id, _evaluation(0, [True], input_tokens=None, output_tokens=None))
    updated = store.get_run(run.run_id)
    assert updated is not None
    assert (updated.input_tokens, updated.output_tokens) == (None, None)


def test_evaluations_round_trip(store: Store) -> None:
    run = _new_run(store)
    originals = [
        _evaluation(0, [True, False]),
        _evaluation(1, [True, True], unverified=True),
        _evaluation(
            2, [], result="grader_error", status="grader_error",
            explanation="TimeoutError: grader timed out", input_tokens=None,
        ),
    ]
    for ev in originals:
        store.add_evaluation(run.run_id, ev)
    assert store.evaluations(run.run_id) == originals
    assert store.evaluations("missing") == []


def test_evaluations_for_runs(store: Store) -> None:
    a, b, c = _new_run(store), _new_run(store), _new_run(store)
    store.add_evaluation(a.run_id, _evaluation(0, [False]))
    store.add_evaluation(a.run_id, _evaluation(1, [True]))
    store.add_evaluation(c.run_id, _evaluation(0, [True]))
    got = store.evaluations_for_runs([c.run_id, a.run_id, b.run_id])
    assert list(got) == [c.run_id, a.run_id, b.run_id]
    assert [ev["iteration"] for ev in got[a.run_id]] == [0, 1]
    assert got[b.run_id] == []


def test_add_evaluation_to_unknown_run(store: Store) -> None:
    with pytest.raises(KeyError, match="no run"):
        store.add_evaluation("missing", _evaluation(0, [True]))


def test_finish_run(store: Store) -> None:
    run = _new_run(store)
    store.finish_run(run.run_id, "error", error="boom", duration_s=1.5)
    store.finish_run(run.run_id, "error", error="boom")
    done = store.get_run(run.run_id)
    assert done is not None
    assert (done.status, done.error, done.duration_s) == ("error", "boom", 1.5)
    with pytest.raises(ValueError, match="unknown run status"):
        store.finish_run(run.run_id, "done")
    with pytest.raises(KeyError):
        store.finish_run("missing", "failed")


def test_list_runs_most_recent_first_and_paging(store: Store) -> None:
    ids = [_new_run(store, title=f"run {i}").run_id for i in range(5)]
    listed = [r.run_id for r in store.list_runs()]
    assert listed == ids[::-1]
    assert [r.run_id for r in store.list_runs(limit=2, offset=1)] == ids[3:1:-1]
    assert len(store.list_runs(limit=None)) == 5
    assert store.count_runs() == 5


def test_list_runs_filters(store: Store) -> None:
    a = _new_run(store, title="Straße essay", worker_model="openai:gpt-x")
    b = _new_run(store, prompt="Write a HAIKU", grader_model="openai:gpt-x")
    c = _new_run(store, rubric="- mentions ÉCOLE")
    store.finish_run(a.run_id, "satisfied")
    store.finish_run(b.run_id, "failed")

    def ids(**filters: Any) -> set[str]:
        found = {r.run_id for r in store.list_runs(**filters)}
        assert store.count_runs(**filters) == len(found)
        return found

    assert ids(status="satisfied") == {a.run_id}
    assert ids(status=["satisfied", "running"]) == {a.run_id, c.run_id}
    assert ids(status=[]) == set()
    assert ids(model="openai:gpt-x") == {a.run_id, b.run_id}
    assert ids(model="openai:gpt") == set()
    assert ids(text="haiku") == {b.run_id}
    assert ids(text="STRASSE") == {a.run_id}  # casefold, not only ASCII lower()
    assert ids(text="école") == {c.run_id}
    assert ids(text="essay", status="satisfied") == {a.run_id}
    with pytest.raises(ValueError):
        store.list_runs(status="finished")


def test_list_runs_uses_indexes(tmp_path: Path) -> None:
    with Store(tmp_path / "db.sqlite3") as store:
        _new_run(store)
    conn = sqlite3.connect(tmp_path / "db.sqlite3")
    plan = " ".join(
        str(row[-1])
        for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM runs WHERE status = ? "
            "ORDER BY created_at DESC, rowid DESC LIMIT 10",
            ("failed",),
        )
    )
    conn.close()
    assert "rs_runs_status" in plan
    assert "TEMP B-TREE" not in plan


def _tiny_graph(store: Store) -> Any:
    class State(TypedDict):
        n: int
        note: NotRequired[str]

    builder = StateGraph(State)
    builder.add_node("inc", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "inc")
    builder.add_edge("inc", END)
    return builder.compile(checkpointer=store.saver())


def test_delete_run_removes_index_rows_and_checkpoints(store: Store) -> None:
    graph = _tiny_graph(store)
    run = _new_run(store)
    keep = _new_run(store)
    for r in (run, keep):
        graph.invoke({"n": 1}, {"configurable": {"thread_id": r.thread_id}})
        store.add_evaluation(r.run_id, _evaluation(0, [True]))
    saver = store.saver()
    config = {"configurable": {"thread_id": run.thread_id}}
    assert saver.get_tuple(config) is not None

    assert store.delete_run(run.run_id) is True
    assert store.get_run(run.run_id) is None
    assert store.evaluations(run.run_id) == []
    assert saver.get_tuple(config) is None
    assert saver.get_tuple({"configurable": {"thread_id": keep.thread_id}}) is not None
    assert store.delete_run(run.run_id) is False


def test_delete_run_keeps_thread_shared_with_another_run(store: Store) -> None:
    graph = _tiny_graph(store)
    first = _new_run(store, thread_id="shared")
    _new_run(store, thread_id="shared")
    graph.invoke({"n": 1}, {"configurable": {"thread_id": "shared"}})
    store.delete_run(first.run_id)
    assert store.saver().get_tuple({"configurable": {"thread_id": "shared"}}) is not None


def test_saver_is_cached_and_closed(db_location: str | Path) -> None:
    store = Store(db_location)
    saver = store.saver()
    assert store.saver() is saver
    store.close()
    if store.backend == "sqlite":
        with pytest.raises(sqlite3.ProgrammingError):
            saver.conn.execute("SELECT 1")
    else:
        assert saver.conn.closed  # the connection pool
    assert store.saver() is not saver  # usable again after close
    assert store.saver().get_tuple({"configurable": {"thread_id": "none"}}) is None
    store.close()


def test_sqlite_connections_are_reused_and_commit_with_normal_sync(tmp_path: Path) -> None:
    store = Store(tmp_path / "pool.sqlite3").open()
    backend = store._backend
    assert isinstance(backend, SqliteBackend)
    with backend.connect(write=False) as tx:
        first = tx.conn
        assert tx.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL, in WAL mode
        assert tx.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with backend.connect(write=False) as tx:
        assert tx.conn is first  # taken from the pool, not opened again
    assert store.saver().conn.execute("PRAGMA synchronous").fetchone()[0] == 1

    # A body that fails rolls its writes back; the connection goes back clean.
    with pytest.raises(RuntimeError), backend.connect(write=True) as tx:
        tx.execute("INSERT INTO meta (key, value) VALUES ('half', 'written')")
        raise RuntimeError
    with backend.connect(write=False) as tx:
        assert not tx.conn.in_transaction
        assert tx.execute("SELECT COUNT(*) FROM meta WHERE key = 'half'").fetchone()[0] == 0
    # A database error is not reused at all.
    with pytest.raises(StoreError), backend.connect(write=True) as tx:
        tx.execute("INSERT INTO no_such_table VALUES (1)")
    assert tx.conn not in backend._idle
    run = _new_run(store)
    store.add_evaluation(run.run_id, _evaluation(0, [True]))
    store.close()
    assert backend._idle == []
    with Store(tmp_path / "pool.sqlite3") as again:
        assert len(again.evaluations(run.run_id)) == 1


def test_saver_and_index_from_several_threads(store: Store) -> None:
    graph = _tiny_graph(store)
    runs = [_new_run(store) for _ in range(4)]
    barrier = threading.Barrier(len(runs))
    errors: list[BaseException] = []

    def work(run: RunRecord) -> None:
        try:
            barrier.wait(timeout=10)
            config = {"configurable": {"thread_id": run.thread_id}}
            for i in range(5):
                graph.invoke({"n": i}, config)
                assert store.saver().get_tuple(config) is not None
                store.add_evaluation(run.run_id, _evaluation(i, [i % 2 == 0]))
                assert len(store.list_runs()) == len(runs)
        except BaseException as exc:  # collected: pytest does not see thread exceptions
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert all(len(store.evaluations(r.run_id)) == 5 for r in runs)


def test_concurrent_writers_never_take_the_same_seq_or_version(store: Store) -> None:
    # Each of these reads the latest row and writes the next: the write must hold a lock.
    run = _new_run(store)
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []
    seqs: list[int] = []
    versions: list[int] = []

    def work(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            seqs.append(store.add_evaluation(run.run_id, _evaluation(i, [False])))
            versions.append(store.save_rubric("shared", f"- text {i}"))
        except BaseException as exc:  # collected: pytest does not see thread exceptions
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert sorted(seqs) == list(range(6)) and sorted(versions) == list(range(1, 7))
    assert store.get_run(run.run_id).iterations == 6  # type: ignore[union-attr]


def test_no_api_key_in_database(
    monkeypatch: pytest.MonkeyPatch, db_location: str | Path
) -> None:
    secret = "sk-test-DO-NOT-STORE-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    with Store(db_location) as store:
        graph = _tiny_graph(store)
        run = _new_run(store, worker_model="openai:gpt-4o-mini")
        graph.invoke({"n": 1}, {"configurable": {"thread_id": run.thread_id}})
        store.add_evaluation(run.run_id, _evaluation(0, [True]))
        store.finish_run(run.run_id, "satisfied", duration_s=2.0)
        store.save_rubric("essay", "- has a title")
        assert store.saver().get_tuple({"configurable": {"thread_id": run.thread_id}})
        # The secret is written somewhere a careless store would keep it: the graph's state.
        graph.invoke({"n": 2, "note": f"key {secret}"},
                     {"configurable": {"thread_id": run.thread_id}})
    assert database_holds(db_location, "DO-NOT-STORE") == []
    assert database_holds(db_location, "criterion 0") != []  # the search can find things


# -- rubric library -----------------------------------------------------------------------------


def test_rubric_versions(store: Store) -> None:
    assert store.save_rubric("essay", "- has a title") == 1
    assert store.save_rubric("essay", "- has a title") == 1  # identical text: no new version
    assert store.save_rubric(" essay ", "- has a title\n- cites a source") == 2
    assert store.save_rubric("code", "- has tests") == 1
    assert store.load_rubric("essay") == "- has a title\n- cites a source"
    assert store.load_rubric("essay", 1) == "- has a title"
    assert [v["version"] for v in store.rubric_versions("essay")] == [1, 2]
    assert store.rubric_versions("missing") == []
    listed = store.list_rubrics()
    assert [(r["name"], r["latest_version"]) for r in listed] == [("code", 1), ("essay", 2)]
    assert all(r["updated_at"] for r in listed)


def test_saving_an_older_text_again_is_a_new_version(store: Store) -> None:
    store.save_rubric("r", "- a")
    store.save_rubric("r", "- b")
    assert store.save_rubric("r", "- a") == 3


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        pytest.param("", "- a", "name", id="empty_name"),
        pytest.param("   ", "- a", "name", id="blank_name"),
        pytest.param("r", "", "empty", id="empty_text"),
        pytest.param("r", " \n\t", "empty", id="blank_text"),
    ],
)
def test_save_rubric_rejects_empty(store: Store, name: str, text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        store.save_rubric(name, text)


def test_load_missing_rubric(store: Store) -> None:
    store.save_rubric("r", "- a")
    with pytest.raises(KeyError, match="no saved rubric"):
        store.load_rubric("nope")
    with pytest.raises(KeyError, match="version 9"):
        store.load_rubric("r", 9)


# -- refusing paths (refused file contents: tests/test_store_integrity.py) ----------------------


def test_unwritable_path_parent_is_a_file(tmp_path: Path) -> None:
    # Tests run as root, where chmod 0o500 does not stop writes; a parent that is a regular
    # file cannot hold a database for any user, root included.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(StoreError, match=DB_ENV_VAR) as info:
        Store(blocker / "db.sqlite3").open()
    assert "cannot be created" in str(info.value)
    assert blocker.read_text() == "x"


def test_unwritable_path_under_proc() -> None:
    # /proc only holds kernel entries: no user, root included, can create files there.
    with pytest.raises(StoreError, match=DB_ENV_VAR):
        Store("/proc/rubric-studio-test/db.sqlite3").open()


def test_directory_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="directory"):
        Store(tmp_path).open()


def test_memory_path_is_refused() -> None:
    with pytest.raises(ValueError, match="file path"):
        Store(":memory:")


def test_version_2_file_is_upgraded_and_its_runs_get_settings(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('app', 'rubric-studio'), ('schema_version', '2'),
                                ('created_at', '2026-01-01T00:00:00+00:00');
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, title TEXT NOT NULL,
            prompt TEXT NOT NULL, rubric TEXT NOT NULL, worker_model TEXT NOT NULL,
            grader_model TEXT NOT NULL, max_iterations INTEGER NOT NULL, status TEXT NOT NULL,
            created_at TEXT NOT NULL, updated_at TEXT NOT NULL, duration_s REAL,
            iterations INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER, output_tokens INTEGER,
            error TEXT, worker_system_prompt TEXT, grader_system_prompt TEXT, grader_tools TEXT);
        INSERT INTO runs VALUES ('killed', 'killed', 'Killed', 'p', '- a', 'demo', 'rules', 3,
            'needs_revision', '2026-01-01T00:00:00+00:00', '2026-01-01T00:00:00+00:00', NULL, 1,
            NULL, NULL, NULL, 'sys', '', '["text_stats"]');
    """)
    conn.close()
    with Store(path) as store:
        old = store.get_run("killed")
        assert old is not None and old.status == "interrupted"  # was left between passes
        assert old.settings == RunSettings(prompt="p", rubric="- a", worker_system_prompt="sys",
                                           grader_tools=("text_stats",), title="Killed")
        new = store.create_run(RunSettings(prompt="q", rubric="- b", base_url="http://h/v1"))
        assert store.get_run(new.run_id) == new
    conn = sqlite3.connect(path)
    (stored,) = conn.execute("SELECT settings_json FROM runs WHERE run_id = ?",
                             (new.run_id,)).fetchone()
    (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert RunSettings.from_json(stored) == new.settings and version == str(SCHEMA_VERSION)


def test_a_revision_pass_leaves_the_run_running(store: Store) -> None:
    run = _new_run(store)
    store.add_evaluation(run.run_id, _evaluation(0, [True, False]))
    assert store.get_run(run.run_id).status == "running"
    store.add_evaluation(run.run_id, _evaluation(1, [True, True]))
    assert store.get_run(run.run_id).status == "satisfied"


# --------------------------------------------------------------------------- schema 4


def _graded_run(store: Store) -> str:
    run = store.create_run(title="t", prompt="p", rubric="- a\n- b", worker_model="demo",
                           grader_model="rules", max_iterations=3)
    store.add_evaluation(run.run_id, {
        "grading_run_id": "g", "iteration": 0, "result": "needs_revision", "explanation": "",
        "status": "needs_revision", "unverified": False, "duration_s": 0.1,
        "input_tokens": None, "output_tokens": None, "answer": "x",
        "criteria": [{"name": "a", "passed": True}, {"name": "b", "passed": False, "gap": "g"}]})
    return run.run_id


def test_labels_upsert_by_run_evaluation_criterion_and_labeller(db_location: str | Path) -> None:
    with Store(db_location) as store:
        run_id = _graded_run(store)
        first = store.set_label(run_id, 0, "a", " ana ", agree=True, note="ok")
        again = store.set_label(run_id, 0, "a", "ana", agree=False, correct=False, note="no")
        store.set_label(run_id, 0, "a", "bo", agree=True)
        assert again["created_at"] == first["created_at"] <= again["updated_at"]
        assert [(lb["labeller"], lb["agree"], lb["correct"], lb["note"])
                for lb in store.labels([run_id])] == [("ana", False, False, "no"),
                                                       ("bo", True, None, "")]
        assert store.labels() == store.labels([run_id])
        with pytest.raises(KeyError, match="no criterion 'zzz'"):
            store.set_label(run_id, 0, "zzz", "ana", agree=True)
        with pytest.raises(KeyError, match="no evaluation 7"):
            store.set_label(run_id, 7, "a", "ana", agree=True)
        with pytest.raises(ValueError, match="Your name"):
            store.set_label(run_id, 0, "a", " ", agree=True)
        with pytest.raises(ValueError, match="mark it 'disagree'"):
            store.set_label(run_id, 0, "a", "ana", agree=True, correct=False)
        assert store.delete_label(run_id, 0, "a", "bo")
        store.delete_run(run_id)
        assert store.labels() == []  # labels go with their evaluations


def test_rubric_version_keeps_its_preset_and_identical_saves_write_nothing(
    db_location: str | Path,
) -> None:
    preset = RunSettings(prompt="Write a haiku", rubric="ignored", max_iterations=5,
                         grader_tools=("word_count",))
    with Store(db_location) as store:
        assert store.save_rubric_version("h", "- a", settings=preset) == (1, True)
        assert store.save_rubric_version("h", "- a", settings=preset) == (1, False)
        assert store.save_rubric("h", "- a") == 1  # no preset given: the text decides
        assert store.save_rubric_version("h", "- a", settings=preset.replace(
            max_iterations=4)) == (2, True)
        loaded = store.load_preset("h", 1)
        assert loaded == preset.replace(rubric="- a")
        assert store.load_preset("h").max_iterations == 4
        assert store.save_rubric("plain", "- b") == 1 and store.load_preset("plain") is None
        with pytest.raises(KeyError):
            store.load_preset("h", 9)


def test_schema_3_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with Store(path) as store:
        run_id = _graded_run(store)
        store.save_rubric("h", "- a")
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TABLE labels")
        conn.execute("ALTER TABLE rubric_versions DROP COLUMN settings_json")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.close()
    with Store(path) as store:
        assert store.load_rubric("h") == "- a" and store.load_preset("h") is None
        store.set_label(run_id, 0, "b", "ana", agree=True)
        assert len(store.labels()) == 1
    conn = sqlite3.connect(path)
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    conn.close()
    assert meta["schema_version"] == str(SCHEMA_VERSION) and SCHEMA_VERSION >= 4


def test_runs_for_rubric_ignores_surrounding_whitespace(db_location: str | Path) -> None:
    with Store(db_location) as store:
        a = store.create_run(title="a", prompt="p", rubric="- a\n- b\n")
        store.create_run(title="b", prompt="p", rubric="- other")
        assert [r.run_id for r in store.runs_for_rubric("  - a\n- b")] == [a.run_id]


def _execute(location: str | Path, *statements: str) -> None:
    """Statements run past the store, as an older release's file would have them."""
    if str(location).startswith("postgresql://"):
        import psycopg

        with psycopg.connect(str(location), autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
        return
    conn = sqlite3.connect(location)
    with conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()


def test_an_evaluations_optional_keys_are_kept(db_location: str | Path) -> None:
    extras = {"repeats": 3, "unstable": ["criterion 1"], "regressed": ["criterion 0"],
              "stalled": True, "unknown_criteria": ["ghost"]}
    with Store(db_location) as store:
        run = _new_run(store)
        store.add_evaluation(run.run_id, _evaluation(0, [True, False], **extras))
        store.add_evaluation(run.run_id, _evaluation(1, [True, True]))
        first, second = store.evaluations(run.run_id)
    assert {k: first[k] for k in extras} == extras  # type: ignore[literal-required]
    assert not set(extras) & set(second)


def test_schema_6_evaluations_are_upgraded_in_place(db_location: str | Path) -> None:
    with Store(db_location) as store:
        run = _new_run(store)
        store.add_evaluation(run.run_id, _evaluation(0, [True]))
    _execute(db_location, "ALTER TABLE evaluations DROP COLUMN extra_json",
             "UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    with Store(db_location) as store:
        [old] = store.evaluations(run.run_id)
        assert old["criteria"] == [{"name": "criterion 0", "passed": True}]
        store.add_evaluation(run.run_id, _evaluation(1, [False], unstable=["criterion 0"]))
        assert store.evaluations(run.run_id)[1]["unstable"] == ["criterion 0"]  # type: ignore[typeddict-item]
    assert scalar(db_location, "SELECT value FROM meta WHERE key = 'schema_version'") == str(
        SCHEMA_VERSION)


def test_schema_12_cells_and_regrades_lose_their_lease_columns_and_keep_everything_else(
        db_location: str | Path) -> None:
    from rubric_core.experiments import create_experiment
    from rubric_core.offline.demo_dataset import demo_dataset
    from rubric_core.settings import ExperimentConfig

    with Store(db_location) as store:
        exp = create_experiment(store, demo_dataset(), [ExperimentConfig()])
        before = [(c.key, c.thread_id) for c in store.experiment_cells(exp.experiment_id)]
    real = "DOUBLE PRECISION" if str(db_location).startswith("postgresql://") else "REAL"
    # A schema 12 database: the cells' lease columns, one of them holding a lease.
    _execute(db_location, "ALTER TABLE experiment_cells ADD COLUMN lease_owner TEXT",
             f"ALTER TABLE experiment_cells ADD COLUMN lease_expires_at {real}",
             "UPDATE experiment_cells SET lease_owner = 'w', lease_expires_at = 1.0",
             "ALTER TABLE regrade_jobs ADD COLUMN owner TEXT",
             f"ALTER TABLE regrade_jobs ADD COLUMN hold_expires_at {real}",
             "UPDATE meta SET value = '12' WHERE key = 'schema_version'")
    with Store(db_location) as store:
        assert [(c.key, c.thread_id) for c in store.experiment_cells(exp.experiment_id)
                ] == before
    pg = str(db_location).startswith("postgresql://")
    for table in ("experiment_cells", "regrade_jobs"):
        column = (f"SELECT COUNT(*) FROM information_schema.columns WHERE table_name = "
                  f"'{table}' AND column_name IN ('lease_owner', 'lease_expires_at', 'owner', "
                  "'hold_expires_at')" if pg else
                  f"SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name IN "
                  "('lease_owner', 'lease_expires_at', 'owner', 'hold_expires_at')")
        assert scalar(db_location, column) == 0, table
    assert scalar(db_location, "SELECT value FROM meta WHERE key = 'schema_version'") == str(
        SCHEMA_VERSION)
