"""The embedded backend: one SQLite file holds LangGraph's checkpoints and our tables.

Threads: Streamlit runs each script run on its own thread, so no ``sqlite3.Connection`` is tied
to one. Our own tables use a small pool: each operation takes an idle connection (or opens
one), uses it alone, and puts it back when it ended cleanly; the saver holds one long-lived
connection opened with ``check_same_thread=False`` and serialises access with its own lock.

Durability: the file is in WAL mode and every connection commits with ``synchronous=NORMAL``,
SQLite's recommended pairing for WAL: a commit survives the process being killed (kill -9) and
the file is never corrupted, but the last commits before a power cut or an OS crash may be
rolled back. ``FULL`` would add an fsync to every commit (several milliseconds here), and
every checkpoint write and recorded event is a commit.

Safety: a file is written only when it is absent or empty (0 bytes), or is ours — its header
carries :data:`APPLICATION_ID`, or it has our ``meta`` table (files from releases before the
application_id, which are upgraded in place) — at a schema this version reads, and it passes
SQLite's ``quick_check`` (its full ``integrity_check`` when a ``-wal`` would be replayed into
it). These checks run before any connection that can write (ours or the ``SqliteSaver``'s)
opens the file, and read it without creating ``-wal``/``-shm`` files. Any other file (not
SQLite, damaged, another application's, newer, mid-transaction) is refused with `StoreError`
and left byte-for-byte untouched, and so is a location another user controls (see
`SqliteBackend._check_ownership`).
"""

from __future__ import annotations

import functools
import os
import shlex
import sqlite3
import stat
import threading
import urllib.parse
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rubric_core.store._schema import (
    DB_ENV_VAR,
    SCHEMA_VERSION,
    SQLITE,
    Refusals,
    StoreError,
    apply_schema,
    check_meta,
    foreign_tables,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from pathlib import Path

    from langgraph.checkpoint.sqlite import SqliteSaver

APPLICATION_ID = 0x52625374
"""SQLite ``PRAGMA application_id`` of our files: the ASCII bytes ``RbSt`` (1382175604).

Written into the file header (offset 68, big-endian) when a file is created or upgraded, so
that our check (through a read-only connection), ``file(1)`` and ``sqlite3 .dbinfo`` can tell
the file's owner before it is written. Files from releases before it have 0 there and are
recognised by their ``meta`` table.
"""

_SQLITE_READONLY_ROLLBACK = 776  # a hot journal that a read-only connection cannot roll back
_TIMEOUT_S = 10.0
_IDLE_CONNECTIONS = 8  # kept open per backend for reuse; more may be open while busy
_SIDE_FILES = ("-wal", "-shm", "-journal")


class _SqliteTx:
    """`rubric_core.store._schema.Tx` over a ``sqlite3.Connection``."""

    dialect = SQLITE

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], *,
                    pipelined: bool = False) -> None:
        del pipelined  # PostgreSQL's concern
        self.conn.executemany(sql, rows)

    def lock(self, key: str) -> None:
        """Nothing to do: ``BEGIN IMMEDIATE`` already holds the file's one write lock."""


class SqliteBackend:
    """A SQLite file (see the module docstring)."""

    dialect = SQLITE
    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)
        self._lock = threading.Lock()
        self._saver: SqliteSaver | None = None
        self._idle: list[sqlite3.Connection] = []

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> None:
        """Validate the file and create or upgrade our tables."""
        self._prepare_location()
        self._inspect_existing()
        self._create_schema()

    def close(self) -> None:
        """Close the saver's connection and the idle ones; a later use opens new ones."""
        with self._lock:
            saver, self._saver = self._saver, None
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        if saver is not None:
            with saver.lock:  # wait for an operation in flight on another thread
                saver.conn.close()

    def saver(self) -> SqliteSaver:
        """A ``SqliteSaver`` on a connection made with ``check_same_thread=False``."""
        with self._lock:
            if self._saver is None:
                from rubric_core.redact import RedactingSerializer

                try:
                    conn = sqlite3.connect(self.path, timeout=_TIMEOUT_S, check_same_thread=False)
                except sqlite3.Error as exc:
                    raise self.error(exc) from exc
                # Checkpoints never hold a secret (an echoed key in an error, say).
                saver = _redacting_saver_class()(conn, serde=RedactingSerializer())
                conn.execute("PRAGMA synchronous = NORMAL")  # see Durability above
                try:
                    saver.setup()
                except sqlite3.Error as exc:
                    conn.close()
                    raise self.error(exc) from exc
                self._saver = saver
            return self._saver

    @staticmethod
    def clock_offset_s() -> float:
        """0: a SQLite file is written on this machine, by this machine's clock."""
        return 0.0

    @contextmanager
    def connect(self, *, write: bool) -> Iterator[_SqliteTx]:
        """A pooled connection; with ``write``, one IMMEDIATE transaction around the body."""
        conn = self._take()
        clean = False
        try:
            if write:
                # IMMEDIATE takes the write lock up front, so read-then-insert cannot race.
                conn.execute("BEGIN IMMEDIATE")
            yield _SqliteTx(conn)
            if conn.in_transaction:
                conn.execute("COMMIT")
            clean = True
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise self.error(exc) from exc
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            clean = not conn.in_transaction  # our own refusal, after a clean rollback
            raise
        finally:
            self._give_back(conn, reuse=clean)

    def _take(self) -> sqlite3.Connection:
        """An idle connection, or a new one (used by one thread at a time, then given back)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        try:
            conn = sqlite3.connect(self.path, timeout=_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise self.error(exc) from exc
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")  # see Durability above
        except sqlite3.Error as exc:
            conn.close()
            raise self.error(exc) from exc
        return conn

    def _give_back(self, conn: sqlite3.Connection, *, reuse: bool) -> None:
        with self._lock:
            if reuse and len(self._idle) < _IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    # -- messages -------------------------------------------------------------------------------

    def _unwritable(self, reason: str) -> StoreError:
        return StoreError(
            f"Cannot use {self.path} as the Rubric Studio database: {reason}. Set {DB_ENV_VAR} "
            "(or pass --db) to a file path in a directory you can write to "
            f"(for example {DB_ENV_VAR}=~/rubric_studio.sqlite3) and start again."
        )

    def _not_ours(self, reason: str) -> StoreError:
        return StoreError(
            f"{self.path} is not a Rubric Studio database ({reason}). The file was left "
            f"untouched: move it aside or choose another file with {DB_ENV_VAR} or --db."
        )

    def _damaged(self, reason: str) -> StoreError:
        return StoreError(
            f"{self.path} {reason}. The file was left untouched: restore it from a backup or "
            f"choose another file with {DB_ENV_VAR} or --db."
        )

    def _newer(self, version: int) -> StoreError:
        return StoreError(
            f"{self.path} was written by a newer Rubric Studio (schema {version}; this "
            f"version reads up to {SCHEMA_VERSION}). The file was left untouched: upgrade "
            f"Rubric Studio or choose another file with {DB_ENV_VAR} or --db."
        )

    def error(self, exc: Exception) -> StoreError:
        """A ``sqlite3.Error`` as a `StoreError` that says what to do."""
        text = str(exc)
        if "not a database" in text or "malformed" in text:
            return self._damaged(f"cannot be read by SQLite ({text})")
        if getattr(exc, "sqlite_errorcode", None) == _SQLITE_READONLY_ROLLBACK:
            return StoreError(
                f"{self.path} has an unfinished transaction in {self.path.name}-journal, left "
                "by a program that stopped while writing it, and SQLite can only roll it back "
                "by writing to the file. The file was left untouched: if you trust the file, "
                f"roll the transaction back with `sqlite3 {shlex.quote(str(self.path))} 'PRAGMA "
                f"quick_check'` and start again, or choose another file with {DB_ENV_VAR} or --db."
            )
        if "readonly" in text or "unable to open" in text:
            return self._unwritable(text)
        if "locked" in text or "busy" in text:
            return StoreError(
                f"The database {self.path} stayed locked by another process for "
                f"{_TIMEOUT_S:.0f} s ({text}). Try again, or stop the other process."
            )
        return StoreError(f"Database error on {self.path}: {text}")

    # -- checks before writing ------------------------------------------------------------------

    def _prepare_location(self) -> None:
        path = self.path
        if path.is_dir():
            msg = "it is a directory, not a file"
            raise self._unwritable(msg)
        if path.exists() and not path.is_file():
            # A FIFO or device would block or lie on read; only regular files hold databases.
            msg = "it is not a regular file"
            raise self._unwritable(msg)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"its directory {path.parent} cannot be created ({exc.strerror or exc})"
            raise self._unwritable(msg) from exc
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            msg = "the file is not readable and writable by this user"
            raise self._unwritable(msg)
        # SQLite writes its journal / WAL files next to the database.
        if not os.access(path.parent, os.W_OK | os.X_OK):
            msg = f"the directory {path.parent} is not writable"
            raise self._unwritable(msg)
        self._check_ownership()

    def _check_ownership(self) -> None:
        """Refuse a location another user controls, before SQLite opens (or creates) anything.

        Whoever can write to the database's directory can plant the file, a symlink in its
        place or its ``-wal``/``-journal`` before this process creates them (a WAL is replayed
        into the database on open), and read whatever is written. So: the directory (the
        link's and the file's, for a symlink) must belong to this user or root and must not be
        writable by every user (``/tmp`` is not a place for a database); the file and its side
        files, where they exist, must be this user's regular files; and a symlink must point
        at an existing file, as SQLite would otherwise create one wherever it points.
        """
        path, uid = self.path, os.geteuid()
        real = path.resolve()
        if path.is_symlink() and not real.exists():
            msg = (f"it is a symbolic link to {real}, which does not exist, and SQLite would "
                   "create a file wherever the link points")
            raise self._unwritable(msg)
        for directory in dict.fromkeys((path.parent.resolve(), real.parent)):
            info = directory.stat()
            if info.st_mode & stat.S_IWOTH:
                msg = (f"its directory {directory} can be written by every user, so another "
                       "user could replace the file or plant its journal; choose a directory "
                       "only you can write to")
                raise self._unwritable(msg)
            if info.st_uid not in (uid, 0):
                msg = (f"its directory {directory} belongs to another user (uid "
                       f"{info.st_uid}), who could replace the file or plant its journal")
                raise self._unwritable(msg)
        for name in (real.name, *(real.name + suffix for suffix in _SIDE_FILES)):
            try:
                info = os.lstat(real.with_name(name))
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
                what = "is not a regular file" if not stat.S_ISREG(info.st_mode) else (
                    f"belongs to another user (uid {info.st_uid})")
                msg = (f"{real.with_name(name)} {what}: a database is opened only from files "
                       "this user owns")
                raise self._unwritable(msg)

    def _inspect_existing(self) -> None:
        """Refuse a file that is not ours to write, before any connection can write to it.

        Reads only, and creates no side files: a read-only connection reads the header (SQLite
        magic, application_id), our ``meta`` table and ``quick_check``. An empty or absent file
        passes: it becomes ours.

        The file is never opened outside SQLite: closing any descriptor of a file drops every
        POSIX lock this process holds on it, those of its open connections included, and then
        another process closing its last connection takes the file for its own and deletes the
        write-ahead log this process still writes to. SQLite keeps such descriptors open while
        a connection of the process holds locks; a plain read would not (a second store opened
        on a file in use here lost the first one's committed rows that way).
        """
        path = self.path
        try:
            if path.stat().st_size == 0:
                return
        except FileNotFoundError:
            return
        except OSError as exc:
            msg = f"the file cannot be read ({exc.strerror or exc})"
            raise self._unwritable(msg) from exc
        try:
            conn = sqlite3.connect(
                _read_only_uri(path), uri=True, timeout=_TIMEOUT_S, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise self.error(exc) from exc
        # A -wal beside the file is replayed into it on the first write, whatever database it
        # came from: frames of another file (ours or not) mix two databases' pages into b-trees
        # whose tables and indexes disagree, which quick_check does not compare. With a WAL
        # present the full integrity_check judges the file as SQLite is about to see it.
        check = "integrity_check" if _wal_present(path) else "quick_check"
        try:
            self._identify(conn)
            problem = conn.execute(f"PRAGMA {check}(1)").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
                msg = "it is not a SQLite database at all"
                raise self._not_ours(msg) from exc
            raise self.error(exc) from exc
        except sqlite3.Error as exc:
            raise self.error(exc) from exc
        finally:
            conn.close()
        if problem != "ok":
            first = " ".join(str(problem).replace("*** in database main ***", "").split())
            msg = f"failed SQLite's integrity check ({check}: {first[:200]})"
            if check == "integrity_check":
                msg += (f"; if {path.name}-wal beside it came from another database, moving "
                        "that file aside may be all it needs")
            raise self._damaged(msg)

    def _check_application_id(self, app_id: int) -> None:
        if app_id not in (0, APPLICATION_ID):
            msg = (
                f"it belongs to another application: its SQLite application_id is "
                f"{app_id & 0xFFFFFFFF:#010x}, Rubric Studio's is {APPLICATION_ID:#010x}"
            )
            raise self._not_ours(msg)

    def _identify(self, conn: sqlite3.Connection) -> None:
        """Raise unless the non-empty database on ``conn`` is ours at a schema we can read."""
        (app_id,) = conn.execute("PRAGMA application_id").fetchone()
        self._check_application_id(app_id)
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        if "meta" not in tables:
            if app_id == APPLICATION_ID:
                msg = "carries Rubric Studio's application_id but has no meta table"
                raise self._damaged(msg)
            raise self._not_ours(foreign_tables(tables))
        columns = {row[1] for row in conn.execute("PRAGMA table_info(meta)")}
        meta = (
            dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if {"key", "value"} <= columns
            else {}
        )
        check_meta(meta, Refusals(self._not_ours, self._damaged, self._newer))

    def _create_schema(self) -> None:
        """Create or upgrade our tables and mark the file as ours, in one transaction."""
        try:
            conn = sqlite3.connect(self.path, timeout=_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise self.error(exc) from exc
        try:
            conn.execute("BEGIN IMMEDIATE")
            # Again under the write lock, as the file may have changed since it was inspected.
            # A new database stays 0 bytes on disk until the first commit.
            if self.path.stat().st_size:
                self._identify(conn)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

            def columns(table: str) -> set[str]:
                return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}

            apply_schema(_SqliteTx(conn), columns)
            conn.execute("COMMIT")
            # WAL lets the app read while a run writes; it is a property of the file. Switched
            # after the first commit, so an interrupted creation rolls back to an empty file.
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise self.error(exc) from exc
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()


def _read_only_uri(path: Path) -> str:
    """A URI that opens ``path`` read-only without creating ``-wal``/``-shm`` files beside it.

    ``mode=ro`` alone creates them for a WAL database; ``immutable=1`` does not, but it reads
    the file alone, without locks. So ``immutable=1`` is used only when no WAL exists (no
    connection has the file open in WAL mode and none left a WAL behind) and no journal holds a
    transaction; otherwise ``mode=ro`` reads through the side files that are already there.
    """
    real = path.resolve()  # SQLite names side files after the symlink's target
    in_use = _wal_present(real) or _journal_pending(real)
    query = "mode=ro" if in_use else "mode=ro&immutable=1"
    return f"file:{urllib.parse.quote(str(real))}?{query}"


def _journal_pending(path: Path) -> bool:
    """Whether a rollback journal beside ``path`` may hold a transaction (live or interrupted)."""
    real = path.resolve()
    journal = real.with_name(real.name + "-journal")
    return journal.is_file() and journal.stat().st_size > 0


def _wal_present(path: Path) -> bool:
    """Whether a write-ahead log lies beside ``path`` (a live connection's or a leftover)."""
    real = path.resolve()
    return real.with_name(real.name + "-wal").exists()


@functools.cache
def _redacting_saver_class() -> type[SqliteSaver]:
    """``SqliteSaver`` whose checkpoint metadata (JSON, past the serializer) is scrubbed too.

    Its writes are fenced when their config carries a `rubric_core.store._fence.Fence`: the
    owner check and the write are one ``BEGIN IMMEDIATE`` transaction on the saver's
    connection (``SqliteSaver`` itself lets ``sqlite3`` open a deferred one at the first
    ``INSERT``, and commits it even when the body raised). Its async methods (for
    ``astream``) run the sync ones on the event loop.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    from rubric_core.redact import scrub_checkpoint_config
    from rubric_core.store import _fence
    from rubric_core.store._async_saver import SyncBackedAsyncSaver

    class RedactingSqliteSaver(SyncBackedAsyncSaver, SqliteSaver):
        run_on_loop = True  # a local file: sub-millisecond writes, no thread switch

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            clean_config, clean_metadata = scrub_checkpoint_config(config, metadata)
            with _fence.writing(config):
                return super().put(clean_config, checkpoint, clean_metadata, new_versions)

        def put_writes(self, config: Any, writes: Any, task_id: str,
                       task_path: str = "") -> None:
            with _fence.writing(config):
                super().put_writes(config, writes, task_id, task_path)

        @contextmanager
        def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
            fence = _fence.current()
            if fence is None or not transaction:
                with super().cursor(transaction) as cur:
                    yield cur
                return
            with self.lock:
                self.setup()
                cur = self.conn.cursor()
                try:
                    cur.execute("BEGIN IMMEDIATE")  # no claim can commit until we do
                    fence.admit(cur.execute(_fence.OWNER_SQL, (fence.run_id,)).fetchone())
                    yield cur
                    self.conn.commit()
                except BaseException:
                    if self.conn.in_transaction:
                        self.conn.rollback()
                    raise
                finally:
                    cur.close()

    return RedactingSqliteSaver
