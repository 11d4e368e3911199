"""Our tables, written once for both databases, and the checks that a database is ours.

The SQL of `rubric_core.store` is SQLite's and PostgreSQL's common ground (``ON CONFLICT``
upserts, ``trim(x, chars)``, row-value ``IN``), with ``?`` placeholders; the few differences
live in a `Dialect`: PostgreSQL's placeholder, its ``REAL`` (single precision there, so
``DOUBLE PRECISION``), an explicit ``rowid`` (SQLite's implicit one orders rows created in the
same microsecond), and ``FOR UPDATE`` row locks (SQLite has
one writer at a time, so it needs none).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

DB_ENV_VAR = "RUBRIC_STUDIO_DB"
"""Environment variable naming the database: a SQLite file, or a ``postgresql://`` URL."""

SCHEMA_VERSION = 14
"""Version of our own tables; stored in ``meta`` and checked on open.

Version 2 added the runs' ``worker_system_prompt``, ``grader_system_prompt`` and
``grader_tools`` columns. Version 3 added ``settings_json`` (the run's whole
`rubric_core.settings.RunSettings`) and stopped leaving a run in ``needs_revision``: upgraded
rows in that status (runs whose process died between passes) become ``interrupted``. Older
files are upgraded in place on open; their rows without ``settings_json`` get settings derived
from their columns (`RunSettings.from_columns`). Version 4 added the ``labels`` table and
``rubric_versions.settings_json`` (a saved rubric's `RunSettings` preset; NULL in upgraded rows);
version 5 added ``datasets``, ``experiments`` and ``experiment_cells`` (new tables only: older
files gain them in place). Version 6 (the first that PostgreSQL holds) added the runs'
``search_text`` (title, prompt and rubric casefolded, filled in for upgraded rows) and the cells'
``lease_owner`` and ``lease_expires_at`` (`Store.claim_cell`). Version 7 added the
runs' ``owner`` (who records the run now: `Store.claim_run` hands it over and
the former owner's writes are refused) and the evaluations' ``extra_json``: the evaluation's
optional keys (``unstable``, ``repeats``,
``regressed``, ``stalled``, ``unknown_criteria``, and any later ones) as a JSON object, NULL
when it has none (and in upgraded rows). Version 8 added the lab's tables (new tables only:
older files gain them in place): ``answer_sets``, ``answer_items`` and ``answer_labels`` (named,
versioned sets of fixed answers with people's verdicts) and ``regrade_jobs`` and
``regrade_results`` (re-grades of a set under grader configurations, one result row per
configuration × item × repeat, written once).
Version 9 added ``model_calls`` (every model call of
a run, worker and grader, with its bounded messages, reply, tokens and latency:
`rubric_core.store._calls`) and the runs' ``cached_input_tokens`` (the grader's input tokens
read from a prompt cache, summed over the run's passes; NULL in upgraded rows). Version 10
added ``drafts`` (the app's unsent forms, kept across a reload under a random id; never a key).
Version 11 added the experiments' ``budget_json`` (the budget a Start or Resume gave, with the
price overrides it was checked with: `rubric_core.experiments.budget`; NULL when none).
Version 12 added the re-grade results' ``cached_input_tokens`` (of a grading's input tokens,
those read from the provider's prompt cache, priced at the cached price; NULL in upgraded rows,
which are priced as uncached), ``retired_cell_threads`` (the threads a cell's retry replaced,
so the runs on them still count in the experiment's cost; a new table only: a retry made before
it is not linked) and the re-grades' ``owner`` and ``hold_expires_at`` (the process grading one
holds it, `Store.hold_regrade`, so two resumers never both pay for its gradings).
Version 13 dropped the cells' ``lease_owner`` and ``lease_expires_at`` and the re-grades'
``owner`` and ``hold_expires_at`` (`DROPPED_COLUMNS`): which process runs a cell or grades a
re-grade is the queue engine's (`rubric_core.engine`), kept in its own tables.
Version 14 added ``pairwise_judgements``, ``pairwise_pairs`` and ``pairwise_calls`` (two answers
judged against a rubric in both orders, with every call: `rubric_core.store._pairwise`; new
tables only: older files gain them in place).
"""

APP_ID = "rubric-studio"
"""Value of ``meta.app`` that marks a database as ours."""


class StoreError(Exception):
    """A database problem, with a message that says what is wrong and what to do."""


class StoreUnavailable(StoreError):
    """The database server could not be reached, or the connection to it was lost.

    Nothing was half-written (each write is one transaction). Work cut short by it was
    interrupted, not failed: a run that raised it is recorded ``interrupted`` (when the record
    can be written at all) and continues on its own thread at the next Resume.
    """


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised from, a `StoreUnavailable` (a lost database)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 16:  # a cause chain is short; a cycle is not followed
        if isinstance(current, StoreUnavailable):
            return True
        current, seen = current.__cause__ or current.__context__, seen + 1
    return False


@dataclasses.dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the two databases' SQL."""

    name: str
    """``sqlite`` or ``postgresql``."""
    types: Mapping[str, str]
    """Substitutions in the DDL: ``{real}`` (a double) and ``{rowid}`` (a leading column)."""
    lock_rows: str
    """Appended to a ``SELECT`` that must lock the rows it reads until the transaction ends."""

    def ddl(self, statement: str) -> str:
        """A DDL statement of `SCHEMA` in this dialect."""
        return statement.format(**self.types)


SQLITE = Dialect(
    name="sqlite", types={"real": "REAL", "rowid": ""},
    lock_rows="",
)
POSTGRESQL = Dialect(
    name="postgresql",
    types={"real": "DOUBLE PRECISION",
           "rowid": "rowid BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,"},
    lock_rows=" FOR UPDATE",
)

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS runs ({rowid}
        run_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, title TEXT NOT NULL,
        prompt TEXT NOT NULL, rubric TEXT NOT NULL, worker_model TEXT NOT NULL,
        grader_model TEXT NOT NULL, max_iterations INTEGER NOT NULL, status TEXT NOT NULL,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL, duration_s {real},
        iterations INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER, output_tokens INTEGER,
        error TEXT, worker_system_prompt TEXT, grader_system_prompt TEXT, grader_tools TEXT,
        settings_json TEXT, search_text TEXT, owner TEXT, cached_input_tokens INTEGER)""",
    "CREATE INDEX IF NOT EXISTS rs_runs_created ON runs (created_at)",
    "CREATE INDEX IF NOT EXISTS rs_runs_status ON runs (status, created_at)",
    "CREATE INDEX IF NOT EXISTS rs_runs_worker ON runs (worker_model, created_at)",
    "CREATE INDEX IF NOT EXISTS rs_runs_grader ON runs (grader_model, created_at)",
    "CREATE INDEX IF NOT EXISTS rs_runs_thread ON runs (thread_id)",
    """CREATE TABLE IF NOT EXISTS evaluations (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        seq INTEGER NOT NULL, grading_run_id TEXT NOT NULL, iteration INTEGER NOT NULL,
        result TEXT NOT NULL, status TEXT NOT NULL, explanation TEXT NOT NULL,
        criteria_json TEXT NOT NULL, answer TEXT NOT NULL, duration_s {real},
        input_tokens INTEGER, output_tokens INTEGER, unverified INTEGER NOT NULL DEFAULT 0,
        extra_json TEXT, PRIMARY KEY (run_id, seq))""",
    """CREATE TABLE IF NOT EXISTS rubrics (
        name TEXT PRIMARY KEY, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS rubric_versions (
        name TEXT NOT NULL REFERENCES rubrics (name) ON DELETE CASCADE,
        version INTEGER NOT NULL, text TEXT NOT NULL, created_at TEXT NOT NULL,
        settings_json TEXT, PRIMARY KEY (name, version))""",
    # Schema 4: people's labels of criterion verdicts (see `Store.set_label`).
    """CREATE TABLE IF NOT EXISTS labels (
        run_id TEXT NOT NULL, seq INTEGER NOT NULL, criterion TEXT NOT NULL,
        labeller TEXT NOT NULL, agree INTEGER NOT NULL, correct INTEGER, note TEXT NOT NULL,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
        PRIMARY KEY (run_id, seq, criterion, labeller),
        FOREIGN KEY (run_id, seq) REFERENCES evaluations (run_id, seq) ON DELETE CASCADE)""",
    """CREATE TABLE IF NOT EXISTS datasets (
        name TEXT NOT NULL, version INTEGER NOT NULL, jsonl TEXT NOT NULL,
        columns_json TEXT NOT NULL, row_count INTEGER NOT NULL, created_at TEXT NOT NULL,
        PRIMARY KEY (name, version))""",
    """CREATE TABLE IF NOT EXISTS experiments ({rowid}
        experiment_id TEXT PRIMARY KEY, name TEXT NOT NULL, dataset_name TEXT NOT NULL,
        dataset_version INTEGER NOT NULL, configs_json TEXT NOT NULL, repeats INTEGER NOT NULL,
        status TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
        FOREIGN KEY (dataset_name, dataset_version) REFERENCES datasets (name, version))""",
    "CREATE INDEX IF NOT EXISTS rs_experiments_created ON experiments (created_at)",
    """CREATE TABLE IF NOT EXISTS experiment_cells (
        experiment_id TEXT NOT NULL REFERENCES experiments (experiment_id) ON DELETE CASCADE,
        seq INTEGER NOT NULL, row_id TEXT NOT NULL, config_index INTEGER NOT NULL,
        repeat_index INTEGER NOT NULL, thread_id TEXT NOT NULL UNIQUE,
        PRIMARY KEY (experiment_id, config_index, row_id, repeat_index))""",
    "CREATE INDEX IF NOT EXISTS rs_cells_seq ON experiment_cells (experiment_id, seq)",
    # Schema 8: the rubric lab (`rubric_core.store._lab`).
    """CREATE TABLE IF NOT EXISTS answer_sets (
        name TEXT NOT NULL, version INTEGER NOT NULL, source TEXT NOT NULL,
        item_count INTEGER NOT NULL, label_count INTEGER NOT NULL, digest TEXT NOT NULL,
        created_at TEXT NOT NULL, PRIMARY KEY (name, version))""",
    """CREATE TABLE IF NOT EXISTS answer_items (
        set_name TEXT NOT NULL, set_version INTEGER NOT NULL, seq INTEGER NOT NULL,
        item_id TEXT NOT NULL, request TEXT NOT NULL, answer TEXT NOT NULL, rubric TEXT,
        origin TEXT NOT NULL, PRIMARY KEY (set_name, set_version, item_id),
        FOREIGN KEY (set_name, set_version) REFERENCES answer_sets (name, version)
            ON DELETE CASCADE)""",
    "CREATE INDEX IF NOT EXISTS rs_items_seq ON answer_items (set_name, set_version, seq)",
    """CREATE TABLE IF NOT EXISTS answer_labels (
        set_name TEXT NOT NULL, set_version INTEGER NOT NULL, item_id TEXT NOT NULL,
        criterion TEXT NOT NULL, labeller TEXT NOT NULL, passed INTEGER NOT NULL,
        note TEXT NOT NULL, PRIMARY KEY (set_name, set_version, item_id, criterion, labeller),
        FOREIGN KEY (set_name, set_version, item_id)
            REFERENCES answer_items (set_name, set_version, item_id) ON DELETE CASCADE)""",
    """CREATE TABLE IF NOT EXISTS regrade_jobs ({rowid}
        job_id TEXT PRIMARY KEY, name TEXT NOT NULL, set_name TEXT NOT NULL,
        set_version INTEGER NOT NULL, configs_json TEXT NOT NULL, status TEXT NOT NULL,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
        FOREIGN KEY (set_name, set_version) REFERENCES answer_sets (name, version))""",
    "CREATE INDEX IF NOT EXISTS rs_regrade_created ON regrade_jobs (created_at)",
    """CREATE TABLE IF NOT EXISTS regrade_results (
        job_id TEXT NOT NULL REFERENCES regrade_jobs (job_id) ON DELETE CASCADE,
        config_index INTEGER NOT NULL, item_id TEXT NOT NULL, repeat_index INTEGER NOT NULL,
        result TEXT NOT NULL, explanation TEXT NOT NULL, criteria_json TEXT NOT NULL,
        missing_json TEXT NOT NULL, error TEXT, input_tokens INTEGER, output_tokens INTEGER,
        duration_s {real}, created_at TEXT NOT NULL, cached_input_tokens INTEGER,
        PRIMARY KEY (job_id, config_index, item_id, repeat_index))""",
    # Schema 9: call traces (see `Store.add_calls`); content_json is NULL once a run's budget
    # of trace text is spent, content_chars counts what it holds.
    """CREATE TABLE IF NOT EXISTS model_calls (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        seq INTEGER NOT NULL, call_id TEXT NOT NULL, role TEXT NOT NULL,
        iteration INTEGER NOT NULL, grading_run_id TEXT, attempt INTEGER NOT NULL DEFAULT 0,
        provider TEXT, model TEXT NOT NULL, status TEXT NOT NULL, error TEXT,
        started_at TEXT NOT NULL, latency_s {real}, first_token_s {real}, input_tokens INTEGER,
        cached_input_tokens INTEGER, cache_creation_tokens INTEGER, output_tokens INTEGER,
        http_retries INTEGER NOT NULL DEFAULT 0, content_json TEXT,
        content_chars INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, seq), UNIQUE (run_id, call_id))""",
    # Schema 12: a retried cell's earlier threads (`ExperimentStore.renew_cell_thread`).
    """CREATE TABLE IF NOT EXISTS retired_cell_threads (
        thread_id TEXT PRIMARY KEY,
        experiment_id TEXT NOT NULL REFERENCES experiments (experiment_id) ON DELETE CASCADE,
        row_id TEXT NOT NULL, config_index INTEGER NOT NULL, repeat_index INTEGER NOT NULL,
        retired_at TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS rs_retired_experiment ON retired_cell_threads (experiment_id)",
    # Schema 10: the app's drafts (`rubric_core.store._drafts`).
    """CREATE TABLE IF NOT EXISTS drafts (
        draft_id TEXT PRIMARY KEY, data_json TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS rs_drafts_updated ON drafts (updated_at)",
    # Schema 14: pairwise judgements (`rubric_core.store._pairwise`).
    """CREATE TABLE IF NOT EXISTS pairwise_judgements (
        judgement_id TEXT PRIMARY KEY, name TEXT NOT NULL, source TEXT NOT NULL,
        grader_model TEXT NOT NULL, base_url TEXT, rubric TEXT NOT NULL, label_a TEXT NOT NULL,
        label_b TEXT NOT NULL, created_at TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS rs_pairwise_created ON pairwise_judgements (created_at)",
    """CREATE TABLE IF NOT EXISTS pairwise_pairs (
        judgement_id TEXT NOT NULL REFERENCES pairwise_judgements (judgement_id)
            ON DELETE CASCADE,
        seq INTEGER NOT NULL, pair_id TEXT NOT NULL, prompt TEXT NOT NULL,
        answer_a TEXT NOT NULL, answer_b TEXT NOT NULL, rubric TEXT NOT NULL,
        criteria_json TEXT NOT NULL, error TEXT, duration_s {real}, input_tokens INTEGER,
        output_tokens INTEGER, created_at TEXT NOT NULL, PRIMARY KEY (judgement_id, seq))""",
    """CREATE TABLE IF NOT EXISTS pairwise_calls (
        judgement_id TEXT NOT NULL, pair_seq INTEGER NOT NULL, seq INTEGER NOT NULL,
        call_id TEXT NOT NULL, role TEXT NOT NULL, iteration INTEGER NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 0, provider TEXT, model TEXT NOT NULL,
        status TEXT NOT NULL, error TEXT, started_at TEXT NOT NULL, latency_s {real},
        first_token_s {real}, input_tokens INTEGER, cached_input_tokens INTEGER,
        cache_creation_tokens INTEGER, output_tokens INTEGER,
        http_retries INTEGER NOT NULL DEFAULT 0, content_json TEXT,
        content_chars INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (judgement_id, pair_seq, seq),
        FOREIGN KEY (judgement_id, pair_seq) REFERENCES pairwise_pairs (judgement_id, seq)
            ON DELETE CASCADE)""",
)

ADDED_COLUMNS: dict[str, dict[str, str]] = {
    "runs": {"worker_system_prompt": "TEXT", "grader_system_prompt": "TEXT",
             "grader_tools": "TEXT", "settings_json": "TEXT", "search_text": "TEXT",
             "owner": "TEXT", "cached_input_tokens": "INTEGER"},
    "rubric_versions": {"settings_json": "TEXT"},
    "experiments": {"budget_json": "TEXT"},
    "evaluations": {"extra_json": "TEXT"},
    "regrade_results": {"cached_input_tokens": "INTEGER"},
}
"""Columns added to a table after it was first released (NULL in upgraded rows)."""

DROPPED_COLUMNS: dict[str, tuple[str, ...]] = {
    # schema 13: which process runs a cell or a re-grade is the queue engine's now
    "experiment_cells": ("lease_owner", "lease_expires_at"),
    "regrade_jobs": ("owner", "hold_expires_at"),
}
"""Columns a later version no longer has, dropped from an upgraded database (with what they
held: nothing reads them)."""

TABLES = ("datasets", "rubrics", "rubric_versions", "runs", "evaluations", "labels",
          "experiments", "experiment_cells", "retired_cell_threads", "answer_sets",
          "answer_items", "answer_labels", "regrade_jobs", "regrade_results", "model_calls",
          "pairwise_judgements", "pairwise_pairs", "pairwise_calls")
"""Our tables other than ``meta`` (and ``drafts``, an unsent form that stays with its server),
each after the ones it refers to: what `rubric_core.store.copy_store` copies."""

SEARCH_SEPARATOR = "\x1f"
"""Between the fields of ``runs.search_text`` (the unit separator: no title holds it)."""


def search_text(title: str, prompt: str, rubric: str) -> str:
    """``runs.search_text``: what `Store.list_runs`'s ``text`` filter looks in, casefolded.

    Stored rather than folded in SQL, as neither database casefolds (``lower('Straße')`` is
    not ``'strasse'``) and their ``lower()`` differ beyond ASCII.
    """
    return SEARCH_SEPARATOR.join(s.casefold() for s in (title, prompt, rubric))


def now() -> str:
    """The current time as the store writes it: ISO 8601 UTC, microseconds."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


class Tx(Protocol):
    """A connection inside one operation (one transaction for writes), on either database.

    Rows can be read by column name and by position, and unpacked like tuples.
    """

    dialect: Dialect

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement with ``?`` placeholders; returns a DB-API cursor."""
        ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], *,
                    pipelined: bool = False) -> None:
        """Run one statement for each parameter row.

        On PostgreSQL one round trip a row, unless ``pipelined``: faster for many rows, but the
        transaction is then not ended by the server if its process pauses right after
        (`rubric_core.store._postgres.execute_each`), so only for writes nobody waits on.
        """
        ...

    def lock(self, key: str) -> None:
        """Serialise this transaction with others that lock ``key``, until it ends.

        A no-op on SQLite, whose write transactions already run one at a time.
        """
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class Refusals:
    """A backend's messages for a database it will not write (each names what to do)."""

    not_ours: Callable[[str], StoreError]
    damaged: Callable[[str], StoreError]
    newer: Callable[[int], StoreError]


def check_meta(meta: Mapping[str, str], refuse: Refusals) -> None:
    """Raise unless ``meta`` (our ``meta`` table's rows) says the database is ours and readable."""
    if meta.get("app") != APP_ID:
        msg = "it belongs to another application: its 'meta' table was not made by Rubric Studio"
        raise refuse.not_ours(msg)
    raw = meta.get("schema_version", "0")
    try:
        version = int(raw)
    except (TypeError, ValueError):
        msg = f"has an unreadable schema_version {raw!r}"
        raise refuse.damaged(msg) from None
    if version > SCHEMA_VERSION:
        raise refuse.newer(version)


def foreign_tables(tables: Sequence[str]) -> str:
    """The reason given for a database with tables but no ``meta``: a few of their names."""
    shown = ", ".join(repr(t) for t in sorted(tables)[:5]) + (", …" if len(tables) > 5 else "")
    return ("it belongs to another application: it has no Rubric Studio meta table and its "
            f"tables are {shown or 'none'}")


def apply_schema(tx: Tx, columns: Callable[[str], set[str]]) -> None:
    """Create or upgrade our tables in ``tx`` (the caller has checked that they are ours).

    Args:
        tx: A write transaction.
        columns: The columns a table has now (the backend's catalogue query).

    """
    dialect = tx.dialect
    had_settings = "settings_json" in columns("runs")
    for statement in SCHEMA:
        tx.execute(dialect.ddl(statement))
    for table, added in ADDED_COLUMNS.items():
        have = columns(table)
        for column, sql_type in added.items():
            if column not in have:
                tx.execute(f"ALTER TABLE {table} ADD COLUMN {column} {dialect.ddl(sql_type)}")
    for table, dropped in DROPPED_COLUMNS.items():
        have = columns(table)
        for column in dropped:
            if column in have:  # SQLite 3.35+ and PostgreSQL drop a plain column in place
                tx.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    if not had_settings:
        # Before schema 3 a run whose process died between passes was left in
        # needs_revision, where nothing offered to resume it.
        tx.execute("UPDATE runs SET status = 'interrupted' WHERE status = 'needs_revision'")
    missing = tx.execute("SELECT run_id, title, prompt, rubric FROM runs "
                         "WHERE search_text IS NULL").fetchall()
    tx.executemany("UPDATE runs SET search_text = ? WHERE run_id = ?",
                   [(search_text(r[1], r[2], r[3]), r[0]) for r in missing])
    tx.executemany("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                   [("app", APP_ID), ("created_at", now())])
    tx.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
               "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (str(SCHEMA_VERSION),))
def execute_each(cursor: Any, sql: str, rows: Iterable[Sequence[Any]]) -> None:
    """Run ``sql`` (psycopg placeholders) once per row, each statement a round trip of its own.

    In place of psycopg's ``executemany`` inside a transaction, so that the server's idle
    timeout (`rubric_core.store._postgres.ENDS_IDLE_TRANSACTIONS`) holds at every moment the
    transaction waits on us.
    psycopg runs ``executemany`` in pipeline mode and leaves the pipeline with a Sync then,
    while results are still to come, a Flush. The server arms its idle-in-transaction timer
    when it answers the Sync and disarms it on the next message, the Flush, which does not arm
    it again: until the next statement, the session waits on its client untimed. A process
    paused there (a fenced checkpoint write between its blobs and its checkpoint, found by the
    SIGSTOP drill on PostgreSQL 15) held its run's row for as long as the pause lasted
    (`tests/test_idle_transactions.py`). The cost: a round trip a row (~0.09 ms on loopback,
    6-8 times pipelined ``executemany``), paid by the few rows our transactions write.
    """
    for row in rows:
        cursor.execute(sql, tuple(row))


