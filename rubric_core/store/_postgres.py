"""The shared backend: a PostgreSQL database holds LangGraph's checkpoints and our tables.

``RUBRIC_STUDIO_DB=postgresql://user:password@host:5432/dbname`` (or ``postgres://``; any libpq
URL parameter works, e.g. ``?sslmode=require`` or ``?options=-csearch_path%3Drubric`` to keep
our tables in their own schema). Needs the ``postgres`` extra
(``pip install 'rubric-studio[postgres]'``).

Connections: one ``psycopg_pool.ConnectionPool`` per `Store` (at most
:data:`POOL_SIZE_ENV` connections, default :data:`DEFAULT_POOL_SIZE`), shared by LangGraph's
``PostgresSaver`` and our tables; connections are in autocommit mode with ``dict_row`` rows, as
the saver needs, and our writes run in explicit transactions. Behind PgBouncer in transaction
mode (before 1.21, or without ``max_prepared_statements``) set
``RUBRIC_STUDIO_PG_PREPARE_THRESHOLD=none`` so that psycopg prepares no statements.

Safety, as for a SQLite file: a database (the URL's schema, ``public`` by default) is written
only when it holds no tables (of any owner: they are read from ``pg_class``), or holds our
``meta`` table at a schema this version reads; any other is refused with `StoreError` and left
untouched (the check and the creation of our tables are one transaction, under an advisory lock
that serialises concurrent first opens). A search_path whose first schema is missing or
temporary is refused too. Once a schema is found to be ours, every connection the store opens
(its pool, shared with the saver, and the saver's setup) has its search_path set to that schema
alone, so that LangGraph's unqualified table names resolve beside our tables: another
application's ``checkpoints`` in a later schema of the search_path (a LangGraph application in
``public``, say) is never read or written.

Credentials come only from the URL (or libpq's ``PGPASSWORD`` / ``~/.pgpass``) and are never
stored; the URL is shown with its password masked (`mask_url`, `rubric_core.store._pg_url`) in
`Store.location`, ``repr`` and every message, and every spelling of the password (and
``PGPASSWORD``) is registered with `rubric_core.redact`. A URL whose password cannot be told
apart from its host (an unencoded ``/``) is refused unshown.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rubric_core.registry import STALE_AFTER_S
from rubric_core.store._pg_url import MASK, mask_url, normalized, servers, unreadable, url_secrets
from rubric_core.store._schema import (
    DB_ENV_VAR,
    POSTGRESQL,
    SCHEMA_VERSION,
    Refusals,
    StoreError,
    StoreUnavailable,
    apply_schema,
    check_meta,
    execute_each,
    foreign_tables,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg_pool import ConnectionPool

POOL_SIZE_ENV = "RUBRIC_STUDIO_PG_POOL_SIZE"
"""Environment variable: the most connections one process's `Store` opens."""

DEFAULT_POOL_SIZE = 4
"""Connections per `Store` when :data:`POOL_SIZE_ENV` is not set."""

PREPARE_THRESHOLD_ENV = "RUBRIC_STUDIO_PG_PREPARE_THRESHOLD"
"""Environment variable: psycopg's ``prepare_threshold`` (``none`` disables, for PgBouncer)."""

INSTALL_HINT = "pip install 'rubric-studio[postgres]'"

_CONNECT_TIMEOUT_S = 10
_POOL_TIMEOUT_S = 30.0
_DOWN_TIMEOUT_S = 3.0
_RECONNECT_S = 5.0
_LOST = ("server closed the connection", "consuming input failed", "terminating connection",
         "the connection is lost", "the connection is closed")
_SCHEMA_LOCK = "rubric-studio:schema"
_SAVER_SETUP_LOCK = "rubric-studio:saver-setup"
_CLOCK_CHECK_S = 300.0
_SAVER_SETUP_WAIT_S = 120.0
_SAVER_SETUP_POLL_S = 0.05


def _env_int(name: str, default: int | None, *, allow_none: bool = False) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if allow_none and raw.lower() in ("none", "off"):
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < (0 if allow_none else 1):
        also = " or 'none'" if allow_none else ""
        minimum = 0 if allow_none else 1
        msg = f"{name}={raw!r} is not a whole number of at least {minimum}{also}: fix or unset it"
        raise StoreError(msg)
    return value


class _Row(tuple[Any, ...]):
    """A result row readable by column name and by position (like ``sqlite3.Row``)."""

    _index: dict[str, int]

    def __new__(cls, values: Sequence[Any], index: dict[str, int]) -> _Row:
        row = super().__new__(cls, values)
        row._index = index
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        """The column names, in order."""
        return list(self._index)


def _row_factory(cursor: Any) -> Any:
    index = {column.name: i for i, column in enumerate(cursor.description or ())}
    return lambda values: _Row(values, index)


@functools.lru_cache(maxsize=512)
def _placeholders(sql: str) -> str:
    """Our ``?`` placeholders as psycopg's ``%s`` (our SQL holds no ``?`` in literals)."""
    return sql.replace("%", "%%").replace("?", "%s")


def _quoted(identifier: str) -> str:
    """A name as a quoted SQL identifier (for a ``::regnamespace`` cast of any spelling)."""
    return '"' + identifier.replace('"', '""') + '"'


ENDS_IDLE_TRANSACTIONS = (
    f"-c idle_in_transaction_session_timeout={round(STALE_AFTER_S * 1000)}")
"""libpq ``options`` that make the server end a session whose transaction sat idle for
`rubric_core.registry.STALE_AFTER_S`, on every connection of ours (the queue engine's too).

A process paused (SIGSTOP, a frozen VM) inside a transaction holds its row locks: a fenced
checkpoint write's ``FOR SHARE`` on its run's row, an evaluation's insert. Another process that
takes the run over once its heartbeat went stale then waits on that lock for as long as the
pause lasts, forever for a process that never wakes. Our transactions last milliseconds; one
idle for as long as a run takes to be presumed lost belongs to a process presumed lost, so the
server ends it (its locks go, its writes are rolled back) and the taker goes on. The paused
process, when it wakes, finds its connection closed: its write fails, as a fenced one would.
A session in pipeline mode, or just out of it, is not timed (`execute_each`): our writes inside
transactions send one statement at a time (`rubric_core.store._pg_saver` too)."""


def _pinned_options(options: str, schema: str) -> str:
    """The ``options`` of libpq, plus a search_path of ``schema`` alone (the last -c wins).

    The schema is a quoted identifier (any spelling), with the whitespace and backslashes that
    libpq's option splitting would act on escaped.
    """
    value = re.sub(r"([\s\\])", r"\\\1", _quoted(schema))
    return f"{options} -c search_path={value}".strip()


def _columns(tx: _PgTx, table: str) -> set[str]:
    """The columns of ``table`` in the schema in use (none when there is no such table)."""
    return {r[0] for r in tx.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = "
        "to_regclass(quote_ident(current_schema()) || '.' || quote_ident(?)) "
        "AND attnum > 0 AND NOT attisdropped", (table,))}


def _migrated(conn: psycopg.Connection[Any]) -> int:
    """The last of LangGraph's checkpoint migrations that ran here (-1 for none)."""
    row = conn.execute("SELECT to_regclass('checkpoint_migrations') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return -1
    row = conn.execute("SELECT coalesce(max(v), -1) FROM checkpoint_migrations").fetchone()
    return int(row[0]) if row else -1


class _PgTx:
    """`rubric_core.store._schema.Tx` over a psycopg connection."""

    dialect = POSTGRESQL

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cursor = self.conn.cursor(row_factory=_row_factory)
        cursor.execute(_placeholders(sql), tuple(params))
        return cursor

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], *,
                    pipelined: bool = False) -> None:
        with self.conn.cursor() as cursor:
            if pipelined:
                rows = [tuple(r) for r in rows]
                if rows:
                    cursor.executemany(_placeholders(sql), rows)
            else:
                execute_each(cursor, _placeholders(sql), rows)

    def lock(self, key: str) -> None:
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))


class PostgresBackend:
    """A PostgreSQL database (see the module docstring)."""

    dialect = POSTGRESQL

    def __init__(self, url: str) -> None:
        self.url = normalized(url)
        self.location = mask_url(self.url)
        if unreadable(self.url):
            msg = (f"{DB_ENV_VAR} (or --db) names a PostgreSQL URL whose user name or password "
                   "holds a character that must be percent-encoded ('/' as %2F, '#' as %23, '@' "
                   "as %40), so where the password ends cannot be told; the URL is not shown "
                   "and nothing was opened. Encode it (urllib.parse.quote(password, safe='')) "
                   "or keep the password out of the URL: PGPASSWORD or ~/.pgpass")
            raise StoreError(msg)
        try:
            import psycopg
            import psycopg_pool
            from psycopg.conninfo import conninfo_to_dict
        except ImportError as exc:
            msg = (f"{DB_ENV_VAR} names a PostgreSQL database ({self.location}), but psycopg "
                   f"is not installed: run {INSTALL_HINT} (or point {DB_ENV_VAR} at a SQLite "
                   "file path)")
            raise StoreError(msg) from exc
        from rubric_core.redact import register_secret

        self._secrets = url_secrets(self.url)
        try:
            self._parsed = {k: str(v) for k, v in conninfo_to_dict(self.url).items()}
        except psycopg.Error as exc:
            msg = (f"{DB_ENV_VAR} (or --db) is not a PostgreSQL URL that libpq can read "
                   f"({self._scrub(' '.join(str(exc).split()))}): see "
                   "https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-CONNSTRING")
            raise StoreError(msg) from exc
        # libpq's own reading of the password, and the one it takes from the environment.
        self._secrets += [v for v in (self._parsed.get("password"),
                                      self._parsed.get("sslpassword"),
                                      os.environ.get("PGPASSWORD")) if v]
        self._secrets.sort(key=len, reverse=True)
        for secret in self._secrets:
            register_secret(secret)  # shown nowhere, whatever echoes it
        self.errors: tuple[type[Exception], ...] = (psycopg.Error, psycopg_pool.PoolTimeout)
        self.pool_size = _env_int(POOL_SIZE_ENV, DEFAULT_POOL_SIZE)
        self.prepare_threshold = _env_int(PREPARE_THRESHOLD_ENV, 5, allow_none=True)
        self._lock = threading.Lock()
        self._clock: tuple[float, float] = (float("-inf"), 0.0)  # (measured at, offset)
        self._pool: ConnectionPool | None = None
        self._saver: PostgresSaver | None = None
        self._schema: str | None = None  # ours, once `open` has checked it

    # -- lifecycle ------------------------------------------------------------------------------

    def _conninfo_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": self.prepare_threshold}
        if "connect_timeout" not in self.url:
            kwargs["connect_timeout"] = _CONNECT_TIMEOUT_S
        # The URL's own options are kept: libpq takes ``options`` from the keyword alone.
        options = self._parsed.get("options", "")
        if self._schema is not None:
            options = _pinned_options(options, self._schema)
        kwargs["options"] = f"{options} {ENDS_IDLE_TRANSACTIONS}".strip()
        return kwargs

    def open(self) -> None:
        """Check that the database is ours (or empty) and create or upgrade our tables."""
        import psycopg

        try:
            conn = psycopg.connect(self.url, **self._conninfo_kwargs())
        except psycopg.Error as exc:
            raise self.error(exc) from exc
        try:
            with conn.transaction():
                tx = _PgTx(conn)
                tx.lock(_SCHEMA_LOCK)  # two first opens at once: one creates, one checks
                schema = self._identify(tx)
                tx.execute("SELECT pg_catalog.set_config('search_path', ?, true)",
                           (_quoted(schema),))
                apply_schema(tx, functools.partial(_columns, tx))
        except psycopg.Error as exc:
            raise self.error(exc) from exc
        finally:
            conn.close()
        self._schema = schema

    def _identify(self, tx: _PgTx) -> str:
        """The schema in use, unless it is neither empty nor ours at a schema version we read.

        The catalogue is read from ``pg_class``, which lists every relation whatever its
        owner: ``information_schema`` shows only those this user holds a privilege on, so
        another role's tables would look like an empty schema.

        Raises:
            StoreError: The schema is missing or temporary, another application's, or newer.

        """
        schema, temporary = tx.execute(
            "SELECT current_schema(), "
            "quote_ident(current_schema())::regnamespace = pg_my_temp_schema()"
        ).fetchone()
        if schema is None:
            msg = ("its search_path names no schema that exists: create the schema, or fix "
                   "the URL's options=-csearch_path")
            raise self._no_schema(msg)
        if temporary or schema.startswith(("pg_temp", "pg_toast")):
            msg = (f"its search_path puts the temporary schema {schema} first, whose tables "
                   "vanish with each connection: name a real schema in options=-csearch_path")
            raise self._no_schema(msg)
        tables = [r[0] for r in tx.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = ?::regnamespace "
            "AND relkind IN ('r', 'p', 'v', 'm', 'f', 'S', 'c') ORDER BY relname",
            (_quoted(schema),))]
        if not tables:
            return str(schema)
        if "meta" not in tables:
            raise self._not_ours(foreign_tables(tables))
        meta = ({str(k): str(v) for k, v in tx.execute("SELECT key, value FROM meta")}
                if {"key", "value"} <= _columns(tx, "meta") else {})
        check_meta(meta, Refusals(self._not_ours, self._damaged, self._newer))
        return str(schema)

    def _get_pool(self) -> ConnectionPool:
        with self._lock:
            if self._pool is None:
                from psycopg.rows import dict_row
                from psycopg_pool import ConnectionPool

                # dict_row and autocommit are what PostgresSaver expects of its connections.
                # A connection is checked as it is handed out (one empty query), so one that
                # a server restart broke is replaced instead of failing an operation; and
                # reconnecting gives up after _RECONNECT_S (the next request starts afresh)
                # rather than backing off for minutes after the server is back. While the
                # server is unreachable, a request waits _DOWN_TIMEOUT_S for a connection,
                # not _POOL_TIMEOUT_S, so a run cut short says so in seconds.
                self._pool = ConnectionPool(
                    self.url, min_size=1, max_size=self.pool_size, open=True,
                    kwargs={**self._conninfo_kwargs(), "row_factory": dict_row},
                    timeout=_POOL_TIMEOUT_S, name="rubric-studio",
                    check=ConnectionPool.check_connection, reconnect_timeout=_RECONNECT_S,
                    configure=lambda _conn: self._reachable(True),
                )
            return self._pool

    def _reachable(self, reachable: bool) -> None:
        """Record whether the server answers: how long a request waits for a connection.

        A new connection, or an operation that got one, says it does; a failed connection
        says it does not.
        """
        pool = self._pool
        if pool is not None:
            pool.timeout = _POOL_TIMEOUT_S if reachable else _DOWN_TIMEOUT_S

    def close(self) -> None:
        """Close the pool (and so the saver's connections); a later use opens a new one."""
        with self._lock:
            pool, self._pool, self._saver = self._pool, None, None
        if pool is not None:
            pool.close()

    def saver(self) -> PostgresSaver:
        """A ``PostgresSaver`` on the pool; its tables are created on first use."""
        pool = self._get_pool()
        with self._lock:
            if self._saver is None:
                from rubric_core.redact import RedactingSerializer
                from rubric_core.store._pg_saver import RedactingPostgresSaver

                # Checkpoints never hold a secret (an echoed key in an error, say): the
                # serializer scrubs what it writes, the subclass what PostgresSaver inlines.
                saver = RedactingPostgresSaver(pool, serde=RedactingSerializer(),
                                               errors=self.errors, explain=self.error)
                self._setup(saver)
                self._saver = saver
            return self._saver

    def _setup(self, saver: PostgresSaver) -> None:
        """Run the saver's migrations, one process at a time, unless they have all run.

        ``setup()`` cannot run in a transaction (its ``CREATE INDEX CONCURRENTLY``), and two
        of those on one table deadlock, so a session-level advisory lock, held on a connection
        of its own, serialises first uses across processes. The lock is taken by polling
        ``pg_try_advisory_lock``: a blocking ``pg_advisory_lock`` would sit in a transaction
        with a snapshot, which the holder's ``CREATE INDEX CONCURRENTLY`` waits for (a
        deadlock of its own). The lock is released explicitly (closing the holding connection
        would too). Once every migration has run, nothing is locked or created: a process that
        finds the tables current (before or while it waits) uses them as they are, so only the
        very first use of a database takes the lock (which matters behind PgBouncer in
        transaction mode, where a session lock outlives the client's connection).
        """
        import psycopg

        latest = len(saver.MIGRATIONS) - 1
        try:
            with psycopg.connect(self.url, **self._conninfo_kwargs()) as holder:
                deadline = time.monotonic() + _SAVER_SETUP_WAIT_S
                while True:
                    if _migrated(holder) >= latest:
                        return
                    locked = holder.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                                            (_SAVER_SETUP_LOCK,)).fetchone()
                    if locked and locked[0]:
                        break
                    if time.monotonic() > deadline:
                        msg = (f"Another process has been creating LangGraph's checkpoint "
                               f"tables in {self.location} for over {_SAVER_SETUP_WAIT_S:.0f} s;"
                               " try again once it has finished (or stop it)")
                        raise StoreError(msg)
                    time.sleep(_SAVER_SETUP_POLL_S)
                try:
                    saver.setup()
                finally:
                    holder.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))",
                                   (_SAVER_SETUP_LOCK,))
        except self.errors as exc:
            raise self.error(exc) from exc

    def clock_offset_s(self) -> float:
        """Seconds to add to this machine's clock to read the database server's clock.

        Measured (one query, half its round trip allowed for) at most every
        `_CLOCK_CHECK_S` seconds, so that every process sharing the database writes and
        judges run heartbeats by one clock, whatever its own says.
        """
        checked, offset = self._clock
        if time.monotonic() - checked < _CLOCK_CHECK_S:
            return offset
        with self.connect(write=False) as tx:
            before = time.time()
            (server,) = tx.execute("SELECT extract(epoch from clock_timestamp())"
                                   "::double precision").fetchone()
            after = time.time()
        offset = float(server) - (before + after) / 2
        self._clock = (time.monotonic(), offset)
        return offset

    @contextmanager
    def connect(self, *, write: bool) -> Iterator[_PgTx]:
        """A pooled connection; with ``write``, one transaction around the body."""
        try:
            with self._get_pool().connection() as conn:
                self._reachable(True)
                if write:
                    with conn.transaction():
                        yield _PgTx(conn)
                else:
                    yield _PgTx(conn)
        except self.errors as exc:
            raise self.error(exc) from exc

    # -- messages -------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        """``text`` with the URL masked and every spelling of its passwords replaced."""
        text = text.replace(self.url, self.location)
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return text

    def _not_ours(self, reason: str) -> StoreError:
        return StoreError(
            f"The PostgreSQL database {self.location} is not a Rubric Studio database "
            f"({reason}). It was left untouched: create an empty database for Rubric Studio "
            f"(`createdb rubric_studio`) and point {DB_ENV_VAR} (or --db) at it."
        )

    def _no_schema(self, reason: str) -> StoreError:
        return StoreError(
            f"The PostgreSQL database {self.location} cannot hold Rubric Studio's tables: "
            f"{reason}. Nothing was written; point {DB_ENV_VAR} (or --db) at a database and "
            "schema of its own."
        )

    def _damaged(self, reason: str) -> StoreError:
        return StoreError(
            f"The PostgreSQL database {self.location} {reason}. It was left untouched: restore "
            f"it from a backup or point {DB_ENV_VAR} (or --db) at another database."
        )

    def _newer(self, version: int) -> StoreError:
        return StoreError(
            f"The PostgreSQL database {self.location} was written by a newer Rubric Studio "
            f"(schema {version}; this version reads up to {SCHEMA_VERSION}). It was left "
            f"untouched: upgrade Rubric Studio or point {DB_ENV_VAR} (or --db) at another "
            "database."
        )

    def error(self, exc: Exception) -> StoreError:
        """A psycopg (or pool) error as a `StoreError` that says what to do."""
        import psycopg
        import psycopg_pool

        text = self._scrub(" ".join(str(exc).split()))
        where = servers(self._parsed)
        sqlstate = getattr(exc, "sqlstate", None)
        if isinstance(exc, psycopg_pool.PoolTimeout):
            self._reachable(False)
            return StoreUnavailable(
                f"No connection to the PostgreSQL database {self.location} ({text}): the "
                f"server at {where} may be down or every pooled connection busy. Check the "
                f"server and {DB_ENV_VAR}, or raise {POOL_SIZE_ENV} (now {self.pool_size})."
            )
        if isinstance(exc, psycopg.OperationalError) and (
                sqlstate in ("57P01", "57P02") or (sqlstate is None and any(
                    lost in text for lost in _LOST))):
            self._reachable(False)
            return StoreUnavailable(
                f"Lost the connection to the PostgreSQL server at {where} for {self.location}: "
                f"{text.rstrip('.')}. Each write is one transaction, so none was half-written: "
                "check that the server is running; a run or experiment cut short is then "
                "offered for Resume."
            )
        if isinstance(exc, psycopg.OperationalError) and sqlstate in (
                None, "08001", "08006", "28000", "28P01", "3D000", "57P03"):
            self._reachable(False)
            hint = (" (create it with `createdb`, or fix the database name)"
                    if "does not exist" in text else "")
            reason = f"{text.rstrip('.')}{hint}"
            end = "" if reason.endswith(("?", "!")) else "."
            # Refused or starting up is a server away for now; a wrong password or database
            # name is the configuration's to fix.
            kind = StoreUnavailable if sqlstate in (None, "08001", "08006", "57P03") else StoreError
            return kind(
                f"Cannot connect to the PostgreSQL server at {where} for {self.location}: "
                f"{reason}{end} Check that the server is running and that {DB_ENV_VAR} (or --db) "
                "names the right host, port, user, password and database."
            )
        return StoreError(f"Database error on {self.location}: {text}")
