"""What every area of the store stands on: the backend, its transactions and its clock.

`StoreCore` picks the backend from the location it is given: a ``postgresql://`` (or
``postgres://``) URL is PostgreSQL (`rubric_core.store._postgres`), anything else a SQLite file
(`rubric_core.store._sqlite`). It opens (checks, creates, upgrades) the database, hands out
one connection per operation (:meth:`StoreCore._connect`: with ``write``, one transaction,
``BEGIN IMMEDIATE`` on SQLite), the LangGraph saver, and the time by the database's clock.

The areas are mixins over it, composed into `rubric_core.store.Store`: runs
(`rubric_core.store._runs`), the library of rubrics and datasets (`._library`), labels
(`._labels`), experiments and their cells (`._experiments`).
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from rubric_core.redact import redact
from rubric_core.store._async_saver import in_thread
from rubric_core.store._pg_url import is_url, mask_url
from rubric_core.store._postgres import PostgresBackend
from rubric_core.store._records import (
    CellOutcome,
    CellRecord,
    DatasetInfo,
    ExperimentRecord,
    PassVerdicts,
    RunRecord,
)
from rubric_core.store._schema import DB_ENV_VAR, SCHEMA_VERSION, StoreError
from rubric_core.store._sqlite import SqliteBackend

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from langgraph.checkpoint.base import BaseCheckpointSaver

    from rubric_core.store._schema import Tx

T = TypeVar("T")

# The records are re-exported here (and `Store` and `RunTakenOver` below) for code that
# imported them from this module before the store was split by area.
__all__ = ["CHUNK", "NO_LIMIT", "SCHEMA_VERSION", "CellOutcome", "CellRecord", "DatasetInfo",
           "ExperimentRecord", "PassVerdicts", "RunRecord", "StoreCore", "StoreError",
           "default_db_path", "shown_location"]

CHUNK = 300
"""Ids per ``IN (...)`` query, well under either database's parameter limit."""

NO_LIMIT = 2**63 - 1
"""``LIMIT`` for "all rows": SQLite takes no NULL there, PostgreSQL no -1."""


def default_db_path() -> Path | str:
    """Where the database lives unless a caller says otherwise.

    Returns:
        ``$RUBRIC_STUDIO_DB`` when set (the URL as a string when it names PostgreSQL, else a
        path), else ``rubric-studio/rubric_studio.sqlite3`` under ``$XDG_DATA_HOME`` (default
        ``~/.local/share``). Directories are created by :meth:`Store.open`, not here.

    """
    configured = os.environ.get(DB_ENV_VAR, "").strip()
    if configured:
        return configured if is_url(configured) else Path(configured).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "rubric-studio" / "rubric_studio.sqlite3"


def shown_location(location: str | Path) -> str:
    """A database location as it may be shown: a file path, or a URL with its password masked."""
    return mask_url(str(location).strip()) if is_url(location) else str(location)


def check_name(name: str, what: str) -> str:
    """``name`` for a saved rubric, dataset or answer set, refused when it holds a key.

    A name is how its versions are found, shown and exported as it is: scrubbed, two names
    could become one, so a name holding a key, text shaped like one (`rubric_core.redact`),
    or a character no database can keep (NUL) is refused instead.

    Raises:
        ValueError: Such a name, saying to choose another.

    """
    if redact(name) != name:
        msg = (f"the {what} name holds an API key or a secret (or text shaped like one, or a NUL "
               "character); give it another name")
        raise ValueError(msg)
    return name


class StoreCore:
    """The database a `rubric_core.store.Store` talks to, without any of its areas.

    Args:
        path: A SQLite file (created, with its parent directories, on first open), or a
            ``postgresql://user:password@host:port/dbname`` URL (``postgres://`` too) naming
            an empty database or one of ours (`rubric_core.store._postgres`).

    Raises:
        ValueError: An in-memory SQLite database (each operation opens its own connection).

    """

    def __init__(self, path: str | Path) -> None:
        self._backend: SqliteBackend | PostgresBackend
        if is_url(path):
            self._backend = PostgresBackend(str(path))
        else:
            if str(path) in ("", ":memory:") or str(path).startswith("file:"):
                msg = (
                    f"Store needs a file path or a postgresql:// URL, got {str(path)!r}: each "
                    "operation opens its own connection, so an in-memory database would be "
                    "empty every time."
                )
                raise ValueError(msg)
            self._backend = SqliteBackend(Path(path).expanduser())
        self._lock = threading.RLock()
        self._opened = False

    @property
    def path(self) -> Path | str:
        """The SQLite file; for PostgreSQL, the URL with its password masked (for messages)."""
        backend = self._backend
        return backend.path if isinstance(backend, SqliteBackend) else backend.location

    @property
    def location(self) -> str:
        """The database as it may be shown: the file's path, or the URL, password masked."""
        return self._backend.location

    def connect_location(self) -> str:
        """The database as a connection needs it: the SQLite file, or the URL WITH its password.

        For a component that shares this database with its own connections (the queue engine,
        `rubric_core.engine`). Never show or log it: `location` is the printable form.
        """
        backend = self._backend
        return str(backend.path) if isinstance(backend, SqliteBackend) else backend.url

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._backend.dialect.name

    def __repr__(self) -> str:
        return f"Store({self.location!r})"

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def now(self) -> str:
        """The current time as the store writes it (ISO 8601 UTC), by the database's clock.

        On PostgreSQL the server's clock (`PostgresBackend.clock_offset_s`), so processes on
        several machines write and judge run heartbeats alike; on SQLite this machine's.
        """
        self.open()  # a database that is not ours is refused before it is asked the time
        offset = self._backend.clock_offset_s()
        moment = datetime.now(UTC) + timedelta(seconds=offset)
        return moment.isoformat(timespec="microseconds")

    def open(self) -> Self:
        """Validate the database and create or upgrade our tables; safe to call repeatedly.

        Returns:
            The store itself.

        Raises:
            StoreError: A SQLite path that is not writable, or a file that is not SQLite,
                fails ``quick_check`` or holds an interrupted transaction; a PostgreSQL
                server that cannot be reached; a database that belongs to another
                application or was written by a newer schema. A refused database is left
                untouched in every case.

        """
        with self._lock:
            if not self._opened:
                self._backend.open()
                self._opened = True
        return self

    def close(self) -> None:
        """Close the saver's connections, if any were made. The store can still be used."""
        self._backend.close()

    def saver(self) -> BaseCheckpointSaver[Any]:
        """The LangGraph checkpointer for this database, shared by all threads.

        Returns:
            On SQLite a ``SqliteSaver`` on a connection made with ``check_same_thread=False``
            (it serialises access with its own lock); on PostgreSQL a ``PostgresSaver`` on the
            store's connection pool. Both wrap `rubric_core.redact.RedactingSerializer`.
            Created once per store (its tables on first use), closed by :meth:`close`. A
            graph run whose config carries a `rubric_core.store.Fence` (``configurable``) has
            its writes stored only while the fence's owner holds its run
            (`rubric_core.store._fence`).

        Raises:
            StoreError: The checkpoint tables cannot be created.

        """
        self.open()
        return self._backend.saver()

    async def acall(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (one of this store's methods) from a coroutine.

        On SQLite it runs right away, on the event loop: a local file answers in well under a
        millisecond, and handing the call to a worker thread costs the loop more CPU (a thread
        switch and the GIL passed twice) than the call itself. On PostgreSQL it runs in a
        worker thread, so a round trip to the server does not hold up the loop's other work;
        a caller cancelled meanwhile still waits for the call to end (a write is never left
        running unseen) before the cancellation goes on.
        """
        if self.backend == "sqlite":
            return fn(*args, **kwargs)
        return await in_thread(fn, *args, **kwargs)

    def _connect(self, *, write: bool = False) -> AbstractContextManager[Tx]:
        """One operation's connection; with ``write``, one transaction around the body."""
        self.open()
        return cast("AbstractContextManager[Tx]", self._backend.connect(write=write))

    def _delete_thread(self, thread_id: str) -> None:
        """Delete a LangGraph thread's checkpoints, a database error as a `StoreError`."""
        try:
            self.saver().delete_thread(thread_id)
        except self._backend.errors as exc:
            raise self._backend.error(exc) from exc
