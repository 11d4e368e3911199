"""Red-team attacks on the database: make Rubric Studio write something corrupt, or write
somewhere another user chose.

Each attack is judged by its effect: the bytes of a file before and after, what exists where
a symlink pointed, SQLite's full ``integrity_check``, an invariant between our own tables after
a writer was killed mid-transaction, an export that parses.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scripted import ScriptedChatModel, verdict

from rubric_core import session
from rubric_core.export import export_rows, write_csv, write_json
from rubric_core.settings import RunSettings
from rubric_core.store import Store, StoreError

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def _ours(path: Path, runs: int = 3, prefix: str = "run") -> None:
    with Store(path) as store:
        for i in range(runs):
            store.create_run(RunSettings(prompt=f"{prefix} prompt {i}", rubric="- r",
                                         title=f"{prefix} {i}"))


@pytest.fixture
def shared_dir(tmp_path: Path) -> Iterator[Path]:
    """A world-writable, sticky directory, like /tmp."""
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(0o1777)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


# --------------------------------------------------------------------------- where it writes


def test_a_symlink_planted_in_a_shared_directory_is_not_followed(
    shared_dir: Path, tmp_path: Path
) -> None:
    # Another user plants the database's name, pointing at an empty file of this user's.
    victim = tmp_path / "notes.cfg"
    victim.write_bytes(b"")
    link = shared_dir / "rubric_studio.sqlite3"
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(StoreError, match="can be written by every user"):
        Store(link).open()
    assert victim.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.cfg", "shared"]


def test_a_dangling_symlink_creates_nothing_where_it_points(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "chosen.sqlite3"
    target.parent.mkdir()
    link = tmp_path / "rubric_studio.sqlite3"
    link.symlink_to(target)
    with pytest.raises(StoreError, match="does not exist"):
        Store(link).open()
    assert list(target.parent.iterdir()) == []


def test_a_database_in_a_shared_directory_is_refused_before_it_exists(shared_dir: Path) -> None:
    with pytest.raises(StoreError, match="can be written by every user"):
        Store(shared_dir / "rubric_studio.sqlite3").open()
    assert list(shared_dir.iterdir()) == []


def test_an_empty_file_another_user_made_is_not_taken_as_new(tmp_path: Path) -> None:
    # 0 bytes counts as "new": but a file another user created is theirs to read and swap.
    planted = tmp_path / "rubric_studio.sqlite3"
    planted.write_bytes(b"")
    planted.chmod(0o666)
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(StoreError, match="belongs to another user"):
        Store(planted).open()
    assert planted.read_bytes() == b""
    assert [p.name for p in tmp_path.iterdir()] == ["rubric_studio.sqlite3"]


def test_a_journal_another_user_planted_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "rubric_studio.sqlite3"
    _ours(db)
    before = db.read_bytes()
    wal = tmp_path / "rubric_studio.sqlite3-wal"
    wal.write_bytes(b"")
    os.chown(wal, NOBODY, NOBODY)
    with pytest.raises(StoreError, match="belongs to another user"):
        Store(db).open()
    assert db.read_bytes() == before and wal.read_bytes() == b""


def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(StoreError, match="belongs to another user"):
        Store(theirs / "rubric_studio.sqlite3").open()
    assert list(theirs.iterdir()) == []


def test_a_symlink_of_this_user_to_its_own_database_still_works(tmp_path: Path) -> None:
    real = tmp_path / "data" / "rubric_studio.sqlite3"
    real.parent.mkdir()
    _ours(real)
    link = tmp_path / "db.sqlite3"
    link.symlink_to(real)
    with Store(link) as store:
        assert len(store.list_runs()) == 3


# --------------------------------------------------------------------------- what it writes


def test_a_wal_from_another_database_is_not_replayed_into_this_one(tmp_path: Path) -> None:
    # SQLite replays whatever -wal lies beside the file. One of another Rubric Studio database
    # passed quick_check (which does not compare tables with their indexes), and the first
    # write checkpointed it: the file then held the other database's rows, its indexes broken.
    ours, other = tmp_path / "a" / "runs.sqlite3", tmp_path / "b" / "runs.sqlite3"
    ours.parent.mkdir()
    other.parent.mkdir()
    _ours(ours, runs=1, prefix="ours")
    _ours(other, runs=3, prefix="other")
    conn = sqlite3.connect(other, isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("UPDATE runs SET title = 'rewritten'")
    shutil.copy(other.with_name("runs.sqlite3-wal"), ours.with_name("runs.sqlite3-wal"))
    conn.close()
    before = ours.read_bytes()
    with pytest.raises(StoreError, match=r"integrity_check.*moving that file aside"):
        Store(ours).open()
    assert ours.read_bytes() == before
    ours.with_name("runs.sqlite3-wal").unlink()
    ours.with_name("runs.sqlite3-shm").unlink(missing_ok=True)
    with Store(ours) as store:  # the file itself was never touched
        assert [r.title for r in store.list_runs()] == ["ours 0"]
    assert _integrity(ours) == "ok"


def test_a_truncated_database_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite3"
    with Store(db) as store:
        for i in range(60):
            store.create_run(RunSettings(prompt=f"prompt {i} " + "p" * 2000, rubric="- r"))
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    before = db.read_bytes()
    with pytest.raises(StoreError):
        Store(db).open()
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.sqlite3"]


WRITER = textwrap.dedent("""
    import itertools, sys
    from rubric_core.settings import RunSettings
    from rubric_core.store import Store
    store = Store(sys.argv[1]).open()
    for i in itertools.count():
        record = store.create_run(RunSettings(prompt=f"prompt {i}", rubric="- a\\n- b"))
        for k in range(4):
            store.add_evaluation(record.run_id, {
                "grading_run_id": f"g{i}", "iteration": k, "result": "needs_revision",
                "status": "needs_revision", "explanation": "x" * 20000,
                "criteria": [{"name": "a", "passed": True},
                             {"name": "b", "passed": False, "gap": "y" * 5000}],
                "answer": "z" * 200000})
        if i == 0:
            print("ready", flush=True)
""")


@pytest.mark.parametrize("rounds", [3])
def test_a_writer_killed_mid_transaction_leaves_a_consistent_database(
    db_location: str | Path, rounds: int
) -> None:
    rng = random.Random(7)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(rounds):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db_location)],
                                stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with Store(db_location) as store:  # not refused: what was committed is intact
            runs = store.list_runs(limit=None)
            assert runs
            for run in runs:
                assert run.iterations == len(store.evaluations(run.run_id)), run
    if isinstance(db_location, Path):
        assert _integrity(db_location) == "ok"


# --------------------------------------------------------------------------- what models send


UNSTORABLE = "a\x00b \ud800 c\udfff"


def test_characters_no_store_can_hold_are_recorded_and_exported_cleanly(
    db_location: str | Path, tmp_path: Path
) -> None:
    # NUL (PostgreSQL refuses it) and lone surrogates (JSON's "\ud800" escape; no UTF-8
    # encoder takes them) from the worker and from a grader's explanation, gap and names.
    worker = ScriptedChatModel(default=f"draft {UNSTORABLE}")
    grader = ScriptedChatModel(replies=[
        verdict("needs_revision", f"why {UNSTORABLE}",
                ["c1", ("c2", f"gap {UNSTORABLE}"), f"unknown {UNSTORABLE}"]),
        verdict("satisfied", f"ok {UNSTORABLE}", ["c1", "c2"]),
    ])
    models = {"worker": worker, "grader": grader}
    settings = RunSettings(prompt=f"Write {UNSTORABLE}", rubric="- c1\n- c2", max_iterations=3)
    with Store(db_location) as store:
        run = session.start(store, settings, models=lambda m, role, url: models[role])
        events = list(run)
        assert events[-1]["status"] == "satisfied", events[-1]
        record = store.get_run(run.run_id)
        assert record is not None and record.status == "satisfied"
        evaluations = store.evaluations(run.run_id)
        assert len(evaluations) == 2
        stored = json.dumps(evaluations, ensure_ascii=False) + record.settings.to_json()
        assert "\x00" not in stored and "\ud800" not in stored
        csv_path, json_path = tmp_path / "out.csv", tmp_path / "out.json"
        with csv_path.open("w", encoding="utf-8", newline="") as fh:
            write_csv(export_rows([(record, evaluations)]), fh)
        with json_path.open("w", encoding="utf-8") as fh:
            write_json(export_rows([(record, evaluations)]), fh)
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text(encoding="utf-8"))))
    assert rows and all("\x00" not in value for row in rows for value in row.values())
    assert json.loads(json_path.read_text(encoding="utf-8"))
