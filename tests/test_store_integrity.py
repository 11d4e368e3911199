"""Tests for rubric_core.store writing only to files that are safely ours.

Every refusal is checked on a real file: the exact bytes before and after, the directory
listing (no ``-wal``, ``-shm`` or ``-journal`` created) and the message.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from rubric_core.store import APPLICATION_ID, DB_ENV_VAR, SCHEMA_VERSION, Store, StoreError

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def _add_runs(store: Store, count: int = 40) -> None:
    for i in range(count):
        store.create_run(title=f"run {i}", prompt=f"prompt {i} " + "p" * 500, rubric="- r",
                         worker_model="fake:worker", grader_model="fake:grader",
                         max_iterations=3)


def _ours_with_runs(path: Path) -> None:
    with Store(path) as store:
        _add_runs(store)
    # Closing the last connection checkpoints the WAL into the file and removes it.
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def _sqlite_file(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


def _readonly(path: Path) -> sqlite3.Connection:
    """A connection that neither writes nor creates side files (for the tests' own checks)."""
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)


def _quick_check(path: Path) -> str:
    conn = _readonly(path)
    try:
        return str(conn.execute("PRAGMA quick_check(1)").fetchone()[0])
    finally:
        conn.close()


def _damage_fullest_leaf_page(path: Path) -> int:
    """Overwrite the b-tree header and cell pointers of the page holding the most rows.

    Garbage inside a row's text, or in the free middle of a lightly used page (such as
    ``meta``'s, page 2), is invisible to ``quick_check``; a page whose structure is broken is not.

    Returns:
        The damaged page's number.
    """
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[16:18], "big")
    # Page 1 starts with the 100-byte file header; the run rows are on later pages.
    # Page 2 is ``meta``'s (created first), which the ownership check reads before
    # quick_check runs; a run row may hold fewer cells per page than it.
    # Leaves of the schema table itself (its CREATE statements outgrow page 1) are skipped
    # too: SQLite cannot open a file whose schema is broken, so quick_check would not run.
    leaves = [
        (int.from_bytes(data[start + 3 : start + 5], "big"), start)
        for start in range(2 * size, len(data), size)
        if data[start] == 0x0D and b"CREATE " not in data[start : start + size]
    ]
    _, start = max(leaves)
    data[start + 1 : start + 64] = b"\xff" * 63  # keep the page type: a leaf with bad pointers
    path.write_bytes(bytes(data))
    return start // size + 1


def _assert_refused(path: Path, match: str, *, via: str = "open") -> str:
    before = path.read_bytes()
    listing = sorted(p.name for p in path.parent.iterdir())
    store = Store(path)
    with pytest.raises(StoreError, match=match) as info:
        store.saver() if via == "saver" else store.open()
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == listing
    return str(info.value)


def _application_id(path: Path) -> int:
    header = path.read_bytes()[:100]
    from_header = int.from_bytes(header[68:72], "big")
    conn = _readonly(path)
    (from_pragma,) = conn.execute("PRAGMA application_id").fetchone()
    conn.close()
    assert from_header == from_pragma
    return from_pragma


# -- accepted -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: None, id="absent_path"),
        pytest.param(lambda p: p.write_bytes(b""), id="empty_file"),
    ],
)
def test_new_file_becomes_ours(tmp_path: Path, make: Callable[[Path], object]) -> None:
    path = tmp_path / "db.sqlite3"
    make(path)
    with Store(path) as store:
        _add_runs(store, 1)
    assert APPLICATION_ID == 0x52625374
    assert _application_id(path) == APPLICATION_ID
    assert path.read_bytes()[18:20] == b"\x02\x02"  # WAL mode
    assert _quick_check(path) == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.sqlite3"]


def test_file_of_the_previous_release_is_upgraded(tmp_path: Path) -> None:
    # The previous release wrote schema 2 with our meta table but no application_id.
    path = tmp_path / "db.sqlite3"
    with Store(path) as store:
        _add_runs(store, 3)
        runs = store.list_runs()
    _sqlite_file(path, "PRAGMA application_id = 0")
    assert _application_id(path) == 0
    with Store(path) as store:
        assert store.list_runs() == runs
    assert _application_id(path) == APPLICATION_ID
    conn = _readonly(path)
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    conn.close()
    assert meta["schema_version"] == str(SCHEMA_VERSION)


# -- refused ------------------------------------------------------------------------------------


def test_damaged_page_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    _ours_with_runs(path)
    page = _damage_fullest_leaf_page(path)
    problem = _quick_check(path)
    assert problem != "ok"
    first = " ".join(problem.replace("*** in database main ***", "").split())
    assert f"page {page}" in first.lower()
    for via in ("open", "saver"):
        message = _assert_refused(path, "failed SQLite's integrity check", via=via)
        assert message == (
            f"{path} failed SQLite's integrity check (quick_check: {first}). The file was left "
            f"untouched: restore it from a backup or choose another file with {DB_ENV_VAR} or "
            "--db."
        )


def test_unreadable_schema_page_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    _sqlite_file(path, "CREATE TABLE t (x TEXT)",
                 *["INSERT INTO t VALUES ('" + "x" * 100 + "')"] * 200)
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xa5" * 3996  # keep the header, destroy the schema page
    path.write_bytes(bytes(data))
    message = _assert_refused(path, r"cannot be read by SQLite \(.*\)")
    assert "restore it from a backup" in message


@pytest.mark.parametrize(
    ("statements", "reason"),
    [
        pytest.param(
            ["CREATE TABLE notes (body TEXT)", "INSERT INTO notes VALUES ('keep me')"],
            "it has no Rubric Studio meta table and its tables are 'notes'",
            id="unrelated_tables",
        ),
        pytest.param(
            ["CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)",
             "INSERT INTO runs (name) VALUES ('theirs')"],
            "it has no Rubric Studio meta table and its tables are 'runs'",
            id="clashing_table",
        ),
        pytest.param(
            ["CREATE TABLE meta (k TEXT, v TEXT)"],
            "its 'meta' table was not made by Rubric Studio",
            id="foreign_meta_columns",
        ),
        pytest.param(
            ["CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
             "INSERT INTO meta VALUES ('app', 'other-app')"],
            "its 'meta' table was not made by Rubric Studio",
            id="foreign_meta_app",
        ),
        pytest.param(
            ["PRAGMA user_version = 7"],
            "it has no Rubric Studio meta table and its tables are none",
            id="no_tables",
        ),
        pytest.param(
            [f"PRAGMA application_id = {0x0F055112}", "CREATE TABLE notes (body TEXT)"],
            "its SQLite application_id is 0x0f055112, Rubric Studio's is 0x52625374",
            id="other_application_id",
        ),
        pytest.param(
            ["PRAGMA application_id = -1", "CREATE TABLE meta (key TEXT, value TEXT)",
             "INSERT INTO meta VALUES ('app', 'rubric-studio')"],
            "its SQLite application_id is 0xffffffff, Rubric Studio's is 0x52625374",
            id="other_application_id_with_our_meta",
        ),
    ],
)
def test_foreign_database_is_refused_untouched(
    tmp_path: Path, statements: list[str], reason: str
) -> None:
    path = tmp_path / "other.sqlite3"
    _sqlite_file(path, *statements)
    message = _assert_refused(path, "another application")
    assert message == (
        f"{path} is not a Rubric Studio database (it belongs to another application: {reason})."
        f" The file was left untouched: move it aside or choose another file with {DB_ENV_VAR}"
        " or --db."
    )


def _newer_schema(path: Path) -> None:
    with Store(path):
        pass
    _sqlite_file(path, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")


NEWER = (
    "{path} was written by a newer Rubric Studio (schema 99; this version reads up to "
    f"{SCHEMA_VERSION}). The file was left untouched: upgrade Rubric Studio or choose another "
    f"file with {DB_ENV_VAR} or --db."
)


def test_newer_schema_in_wal_mode_is_refused_without_side_files(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    _newer_schema(path)
    assert path.read_bytes()[18:20] == b"\x02\x02"  # WAL mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.sqlite3"]
    for via in ("open", "saver"):
        message = _assert_refused(path, "newer Rubric Studio", via=via)
        assert message == NEWER.format(path=path)


def test_newer_schema_still_in_another_connections_wal_is_refused(tmp_path: Path) -> None:
    # The file itself still says schema 2; only the open WAL says 99, so it must be read.
    path = tmp_path / "db.sqlite3"
    with Store(path):
        pass
    other = sqlite3.connect(path)
    try:
        other.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        other.commit()
        assert (tmp_path / "db.sqlite3-wal").stat().st_size > 0
        message = _assert_refused(path, "newer Rubric Studio")
    finally:
        other.close()
    assert message == NEWER.format(path=path)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"run_id,title\nabc,My essay\n", id="text_file"),
        pytest.param(os.urandom(8192), id="random_bytes"),
        pytest.param(b"SQLite format 3\x00", id="truncated_header"),
    ],
)
def test_non_database_file_is_refused_untouched(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "db.sqlite3"
    path.write_bytes(content)
    message = _assert_refused(path, "not a Rubric Studio database")
    assert message == (
        f"{path} is not a Rubric Studio database (it is not a SQLite database at all). The file "
        f"was left untouched: move it aside or choose another file with {DB_ENV_VAR} or --db."
    )


@pytest.mark.parametrize(
    ("committed", "after_roll_back"),
    [
        pytest.param("", "accepted", id="creating_a_new_file"),
        pytest.param("CREATE TABLE t (x BLOB)", "another application", id="writing_its_own"),
    ],
)
def test_unfinished_transaction_is_refused_untouched(
    tmp_path: Path, committed: str, after_roll_back: str
) -> None:
    # A program killed mid-transaction leaves a hot journal, which only a write can roll back.
    path = tmp_path / "db.sqlite3"
    crash = (
        "import os, sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "conn.execute('PRAGMA cache_size = 1')\n"  # spill changed pages into the file early
        "if sys.argv[2]:\n"
        "    conn.execute(sys.argv[2])\n"
        "conn.execute('BEGIN')\n"
        "conn.execute('CREATE TABLE IF NOT EXISTS t (x BLOB)')\n"
        "conn.executemany('INSERT INTO t VALUES (randomblob(1000))', [()] * 500)\n"
        "os._exit(9)\n"
    )
    subprocess.run([sys.executable, "-c", crash, str(path), committed], check=False, timeout=60)
    assert (tmp_path / "db.sqlite3-journal").stat().st_size > 0
    message = _assert_refused(path, "unfinished transaction")
    assert message.endswith(
        f"The file was left untouched: if you trust the file, roll the transaction back with "
        f"`sqlite3 {path} 'PRAGMA quick_check'` and start again, or choose another file with "
        f"{DB_ENV_VAR} or --db."
    )
    _sqlite_file(path, "PRAGMA quick_check")  # what the message advises, without the CLI tool
    if after_roll_back == "accepted":
        assert path.read_bytes() == b""
        with Store(path) as store:
            assert store.count_runs() == 0
    else:
        _assert_refused(path, after_roll_back)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    os.mkfifo(path)
    with pytest.raises(StoreError, match="it is not a regular file"):
        Store(path).open()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.sqlite3"]


def _open_without_file_privileges(path: Path) -> str:
    """Open ``path`` with a Store as a process that file modes bind: the StoreError text.

    Root ignores file modes through CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH; as root (as in CI)
    the open runs in a child whose capability bounding set lacks both, so the mode is real.
    """
    code = ("import sys\nfrom rubric_core.store import Store, StoreError\n"
            "try:\n    Store(sys.argv[1]).open()\nexcept StoreError as exc:\n"
            "    print(exc)\nelse:\n    print('opened')\n")
    prefix = (["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
              if os.geteuid() == 0 else [])
    done = subprocess.run([*prefix, sys.executable, "-c", code, str(path)], check=True,
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip()


def test_unreadable_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    _ours_with_runs(path)
    before = path.read_bytes()
    path.chmod(0o200)
    try:
        message = _open_without_file_privileges(path)
    finally:
        path.chmod(0o600)
    assert "not readable and writable" in message, message
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.sqlite3"]


def test_file_in_use_by_another_store_is_accepted(tmp_path: Path) -> None:
    # The app keeps its saver's connection open while the CLI opens the same file.
    path = tmp_path / "db.sqlite3"
    with Store(path) as app:
        app.saver()
        _add_runs(app, 2)
        assert (tmp_path / "db.sqlite3-wal").exists()
        with Store(path) as cli:
            assert cli.count_runs() == 2
            _add_runs(cli, 1)
        assert app.count_runs() == 3


def test_a_second_store_on_a_file_in_use_here_keeps_the_first_ones_locks(tmp_path: Path) -> None:
    # Closing any descriptor of a file drops every POSIX lock this process holds on it. A
    # second store that read the file's header with a plain open() dropped the first store's
    # locks; another process closing its last connection then took the file for its own and
    # deleted the write-ahead log the first store still wrote to: its next commits went to a
    # deleted file, unseen by every other process (and lost if this one is killed).
    path = tmp_path / "db.sqlite3"

    def count_elsewhere() -> str:
        return subprocess.run(
            [sys.executable, "-c",
             "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
             "print(c.execute('SELECT COUNT(*) FROM rubric_versions').fetchone()[0]); c.close()",
             str(path)], capture_output=True, text=True, timeout=60, check=True).stdout.strip()

    with Store(path) as first:
        first.save_rubric("kept", "- one")
        with Store(path) as second:  # opened and inspected while `first` holds its locks
            assert [r["name"] for r in second.list_rubrics()] == ["kept"]
        assert count_elsewhere() == "1"  # another process opens and closes the file
        first.save_rubric("after", "- two")
        assert count_elsewhere() == "2"  # and sees what this one committed since
