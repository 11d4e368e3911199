"""One SQLite file: LangGraph checkpoints, the run index and the rubric library.

This is the only module that knows which database Rubric Studio talks to. The file holds:

- LangGraph's checkpoint tables (``checkpoints``, ``writes``), written by the ``SqliteSaver``
  that :meth:`Store.saver` returns, keyed by each run's ``thread_id``;
- ``runs`` and ``evaluations``: a small index of runs and their grader passes, so that history,
  filters and exports never have to decode checkpoints; each run keeps its whole
  ``RunSettings`` as JSON (``settings_json``) beside the columns Review filters on;
- ``rubrics`` and ``rubric_versions``: saved rubrics, every version kept, each with the
  `RunSettings` preset it was saved with (``settings_json``: prompt, tools, models, cap);
- ``labels``: people's verdicts on the grader's criterion verdicts (agree / disagree, the
  correct verdict, a note), keyed by run, evaluation, criterion and labeller;
- ``datasets``: saved datasets, every version kept (as the checked JSONL of its rows);
- ``experiments`` and ``experiment_cells``: an experiment's configurations, and one cell per
  dataset row × configuration × repeat, each naming the LangGraph thread its run uses (the
  cell's status and results are its run's, read from ``runs``: one shape, no second copy);
- ``meta``: which application owns the file and its schema version.

Threads: Streamlit runs each script run on its own thread and a ``sqlite3.Connection`` must not
be shared between threads. Our own tables therefore use one short-lived connection per
operation; the saver holds one long-lived connection opened with ``check_same_thread=False``
and serialises access with its own lock. A ``Store`` may be cached and shared across threads.

Safety: a file is written only when it is absent or empty (0 bytes), or is ours — its header
carries :data:`APPLICATION_ID`, or it has our ``meta`` table (files from releases before the
application_id, which are upgraded in place) — at a schema this version reads, and it passes
SQLite's ``quick_check``. These checks run before any connection that can write (ours or the
``SqliteSaver``'s) opens the file, and read it without creating ``-wal``/``-shm`` files. Any
other file (not SQLite, damaged, another application's, newer, mid-transaction) is refused with
:class:`StoreError` and left byte-for-byte untouched. API keys are never stored:
:meth:`Store.create_run` stores a `rubric_core.settings.RunSettings`, which holds none.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sqlite3
import threading
import urllib.parse
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rubric_core.datasets import Dataset, rows_from_jsonl
from rubric_core.settings import ExperimentConfig, RunSettings
from rubric_core.types import CELL_PENDING, EXPERIMENT_STATUSES, RUN_STATUSES, TERMINAL_STATUSES

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Iterator, Sequence

    from langgraph.checkpoint.sqlite import SqliteSaver

    from rubric_core.types import CriterionLabel, RubricEvaluation

__all__ = [
    "APPLICATION_ID", "APP_ID", "DB_ENV_VAR", "RUN_STATUSES", "SCHEMA_VERSION", "CellRecord",
    "DatasetInfo", "ExperimentRecord", "RunRecord", "Store", "StoreError", "default_db_path",
]

DB_ENV_VAR = "RUBRIC_STUDIO_DB"
"""Environment variable naming the database file."""

SCHEMA_VERSION = 5
"""Version of our own tables; stored in ``meta`` and checked on open.

Version 2 added the runs' ``worker_system_prompt``, ``grader_system_prompt`` and
``grader_tools`` columns. Version 3 added ``settings_json`` (the run's whole
`rubric_core.settings.RunSettings`) and stopped leaving a run in ``needs_revision``: upgraded
rows in that status (runs whose process died between passes) become ``interrupted``. Older
files are upgraded in place on open; their rows without ``settings_json`` get settings derived
from their columns (`RunSettings.from_columns`). Version 4 added the ``labels`` table and
``rubric_versions.settings_json`` (a saved rubric's `RunSettings` preset; NULL in upgraded rows);
version 5 added ``datasets``, ``experiments`` and ``experiment_cells`` (new tables only: older
files gain them in place).
"""

APP_ID = "rubric-studio"
"""Value of ``meta.app`` that marks a file as ours."""

APPLICATION_ID = 0x52625374
"""SQLite ``PRAGMA application_id`` of our files: the ASCII bytes ``RbSt`` (1382175604).

Written into the file header (offset 68, big-endian) when a file is created or upgraded, so
that our check, ``file(1)`` and ``sqlite3 .dbinfo`` can tell the file's owner before opening
it. Files from releases before it have 0 there and are recognised by their ``meta`` table.
"""


_SQLITE_HEADER = b"SQLite format 3\x00"
_HEADER_SIZE = 100  # the database header, before the first page's b-tree
_APPLICATION_ID_AT = 68
_SQLITE_READONLY_ROLLBACK = 776  # a hot journal that a read-only connection cannot roll back
_TIMEOUT_S = 10.0
_CHUNK = 500  # ids per IN (...) query, well under SQLite's variable limit

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, title TEXT NOT NULL,
        prompt TEXT NOT NULL, rubric TEXT NOT NULL, worker_model TEXT NOT NULL,
        grader_model TEXT NOT NULL, max_iterations INTEGER NOT NULL, status TEXT NOT NULL,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL, duration_s REAL,
        iterations INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER, output_tokens INTEGER,
        error TEXT, worker_system_prompt TEXT, grader_system_prompt TEXT, grader_tools TEXT,
        settings_json TEXT)""",
    "CREATE INDEX IF NOT EXISTS rs_runs_created ON runs (created_at)",
    "CREATE INDEX IF NOT EXISTS rs_runs_status ON runs (status, created_at)",
    "CREATE INDEX IF NOT EXISTS rs_runs_worker ON runs (worker_model, created_at)",
    "CREATE INDEX IF NOT EXISTS rs_runs_grader ON runs (grader_model, created_at)",
    "CREATE INDEX IF NOT EXISTS rs_runs_thread ON runs (thread_id)",
    """CREATE TABLE IF NOT EXISTS evaluations (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        seq INTEGER NOT NULL, grading_run_id TEXT NOT NULL, iteration INTEGER NOT NULL,
        result TEXT NOT NULL, status TEXT NOT NULL, explanation TEXT NOT NULL,
        criteria_json TEXT NOT NULL, answer TEXT NOT NULL, duration_s REAL,
        input_tokens INTEGER, output_tokens INTEGER, unverified INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, seq))""",
    """CREATE TABLE IF NOT EXISTS rubrics (
        name TEXT PRIMARY KEY, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS rubric_versions (
        name TEXT NOT NULL REFERENCES rubrics (name) ON DELETE CASCADE,
        version INTEGER NOT NULL, text TEXT NOT NULL, created_at TEXT NOT NULL,
        PRIMARY KEY (name, version))""",
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
    """CREATE TABLE IF NOT EXISTS experiments (
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
)
# Columns added to ``runs`` after version 1, with their SQL types (NULL in upgraded rows).
_ADDED_RUN_COLUMNS = {
    "worker_system_prompt": "TEXT", "grader_system_prompt": "TEXT", "grader_tools": "TEXT",
    "settings_json": "TEXT",
}
# Schema 4: columns added to ``rubric_versions`` (NULL in upgraded rows).
_ADDED_VERSION_COLUMNS = {"settings_json": "TEXT"}


class StoreError(Exception):
    """A database problem, with a message that says what is wrong and what to do."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunRecord:
    """One row of the run index: the run's lifecycle and its settings.

    :attr:`settings` is the run's description; the text fields before it are the columns
    Review filters and sorts on, written from the settings when the run is created.
    """

    run_id: str
    """Unique id of the run (uuid4 hex)."""
    thread_id: str
    """LangGraph thread whose checkpoints hold the run's state."""
    title: str
    """Short human label."""
    prompt: str
    """What the worker was asked."""
    rubric: str
    """The rubric text the run was graded against."""
    worker_model: str
    """``provider:model`` of the worker agent."""
    grader_model: str
    """``provider:model`` of the grader."""
    max_iterations: int
    """Cap on grader passes."""
    status: str
    """One of :data:`RUN_STATUSES`."""
    created_at: str
    """ISO 8601 UTC timestamp of creation."""
    updated_at: str
    """ISO 8601 UTC timestamp of the last change."""
    duration_s: float | None
    """Wall-clock seconds of the whole run, once finished."""
    iterations: int
    """Evaluations recorded so far."""
    input_tokens: int | None
    """Grader input tokens summed over evaluations (None when never reported)."""
    output_tokens: int | None
    """Grader output tokens summed over evaluations (None when never reported)."""
    error: str | None
    """Error message for runs that ended in ``error``."""
    worker_system_prompt: str | None = None
    """The worker's system prompt (``""`` for none); None for runs stored before it was kept."""
    grader_system_prompt: str | None = None
    """A custom grader prompt (``""`` for the built-in one); None when not recorded."""
    grader_tools: tuple[str, ...] | None = None
    """Names of the evidence tools the grader was given; None when not recorded."""
    settings: RunSettings = None  # type: ignore[assignment]  # filled in __post_init__
    """The run's whole description; for rows stored before schema 3 (and records built without
    it), derived from the columns above (`RunSettings.from_columns`)."""

    def __post_init__(self) -> None:
        if self.settings is None:
            derived = RunSettings.from_columns(
                title=self.title, prompt=self.prompt, rubric=self.rubric,
                worker_model=self.worker_model, grader_model=self.grader_model,
                max_iterations=self.max_iterations,
                worker_system_prompt=self.worker_system_prompt,
                grader_system_prompt=self.grader_system_prompt, grader_tools=self.grader_tools,
            )
            object.__setattr__(self, "settings", derived)


@dataclasses.dataclass(frozen=True, slots=True)
class DatasetInfo:
    """One stored version of a dataset (without its rows)."""

    name: str
    """The dataset's name."""
    version: int
    """1 for the first version stored under the name."""
    row_count: int
    """Rows in this version."""
    columns: tuple[str, ...]
    """The columns as read, in order."""
    created_at: str
    """ISO 8601 UTC timestamp of when the version was stored."""


@dataclasses.dataclass(frozen=True, slots=True)
class ExperimentRecord:
    """An experiment: a stored dataset version × configurations × repeats."""

    experiment_id: str
    """Unique id (uuid4 hex)."""
    name: str
    """Short human label."""
    dataset_name: str
    """The dataset's name."""
    dataset_version: int
    """The dataset version its cells run."""
    configurations: tuple[ExperimentConfig, ...]
    """The configurations, in order; a cell's ``config_index`` points here."""
    repeats: int
    """Runs of each row under each configuration."""
    status: str
    """One of `rubric_core.types.EXPERIMENT_STATUSES`."""
    created_at: str
    """ISO 8601 UTC timestamp of creation."""
    updated_at: str
    """ISO 8601 UTC timestamp of the last status change."""


@dataclasses.dataclass(frozen=True, slots=True)
class CellRecord:
    """One cell of an experiment: a dataset row under one configuration, one repeat."""

    experiment_id: str
    """The experiment."""
    row_id: str
    """The dataset row's id."""
    config_index: int
    """0-based index into `ExperimentRecord.configurations`."""
    repeat_index: int
    """0-based repeat."""
    thread_id: str
    """The LangGraph thread the cell's run uses (fixed when the experiment is created)."""
    run: RunRecord | None
    """The cell's run (the latest on its thread), or None before it started."""

    @property
    def status(self) -> str:
        """The run's stored status, or ``pending`` (`rubric_core.types.CELL_PENDING`)."""
        return self.run.status if self.run is not None else CELL_PENDING

    @property
    def key(self) -> tuple[str, int, int]:
        """``(row_id, config_index, repeat_index)``: the cell's identity in its experiment."""
        return self.row_id, self.config_index, self.repeat_index


_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunRecord))
_COLUMN_OF = {"settings": "settings_json"}
_RUN_COLUMNS = ", ".join(_COLUMN_OF.get(name, name) for name in _RUN_FIELDS)


def _record(row: Sequence[Any]) -> RunRecord:
    """A run index row (columns in ``_RUN_COLUMNS`` order) as a record."""
    values = dict(zip(_RUN_FIELDS, row, strict=True))
    if values["grader_tools"] is not None:
        values["grader_tools"] = tuple(json.loads(values["grader_tools"]))
    if values["settings"] is not None:
        values["settings"] = RunSettings.from_json(values["settings"])
    return RunRecord(**values)


def _row(record: RunRecord) -> tuple[Any, ...]:
    """A record as the values of a run index row (the inverse of `_record`)."""
    values = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    if values["grader_tools"] is not None:
        values["grader_tools"] = json.dumps(list(values["grader_tools"]), ensure_ascii=False)
    values["settings"] = record.settings.to_json()
    return tuple(values[name] for name in _RUN_FIELDS)


def default_db_path() -> Path:
    """Where the database lives unless a caller says otherwise.

    Returns:
        ``$RUBRIC_STUDIO_DB`` when set, else ``rubric-studio/rubric_studio.sqlite3`` under
        ``$XDG_DATA_HOME`` (default ``~/.local/share``). Directories are created by
        :meth:`Store.open`, not here.

    """
    configured = os.environ.get(DB_ENV_VAR, "").strip()
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "rubric-studio" / "rubric_studio.sqlite3"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _fold(value: object) -> str | None:
    return value.casefold() if isinstance(value, str) else None


def _check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        msg = f"unknown run status {status!r}; expected one of {sorted(RUN_STATUSES)}"
        raise ValueError(msg)


def _row_to_evaluation(row: sqlite3.Row) -> RubricEvaluation:
    return cast(
        "RubricEvaluation",
        {
            "grading_run_id": row["grading_run_id"],
            "iteration": row["iteration"],
            "result": row["result"],
            "explanation": row["explanation"],
            "criteria": json.loads(row["criteria_json"]),
            "status": row["status"],
            "unverified": bool(row["unverified"]),
            "duration_s": row["duration_s"],
            "input_tokens": row["input_tokens"],
            "output_tokens": row["output_tokens"],
            "answer": row["answer"],
        },
    )


def _row_to_label(row: sqlite3.Row) -> CriterionLabel:
    return cast(
        "CriterionLabel",
        {
            "run_id": row["run_id"], "seq": int(row["seq"]), "criterion": row["criterion"],
            "labeller": row["labeller"], "agree": bool(row["agree"]),
            "correct": None if row["correct"] is None else bool(row["correct"]),
            "note": row["note"], "created_at": row["created_at"],
            "updated_at": row["updated_at"],
        },
    )


def _dataset_info(row: sqlite3.Row) -> DatasetInfo:
    return DatasetInfo(name=row["name"], version=int(row["version"]),
                       row_count=int(row["row_count"]),
                       columns=tuple(json.loads(row["columns_json"])),
                       created_at=row["created_at"])


def _experiment(row: sqlite3.Row) -> ExperimentRecord:
    configs = tuple(ExperimentConfig.from_dict(c) for c in json.loads(row["configs_json"]))
    return ExperimentRecord(
        experiment_id=row["experiment_id"], name=row["name"], dataset_name=row["dataset_name"],
        dataset_version=int(row["dataset_version"]), configurations=configs,
        repeats=int(row["repeats"]), status=row["status"], created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class Store:
    """The Rubric Studio database: run index, rubric library and LangGraph checkpoints.

    Nothing touches the disk until :meth:`open` (or the first operation, which opens lazily).
    Use it as a context manager to close the saver's connection when done::

        with Store(default_db_path()) as store:
            run = store.create_run(title="t", prompt="p", rubric="- r", worker_model="w",
                                   grader_model="g", max_iterations=3)

    Args:
        path: The SQLite file; created, with its parent directories, on first open.

    """

    def __init__(self, path: str | Path) -> None:
        if str(path) in ("", ":memory:") or str(path).startswith("file:"):
            msg = (
                f"Store needs a file path, got {str(path)!r}: each operation opens its own "
                "connection, so an in-memory database would be empty every time."
            )
            raise ValueError(msg)
        self._path = Path(path).expanduser()
        self._lock = threading.RLock()
        self._opened = False
        self._saver: SqliteSaver | None = None

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def __repr__(self) -> str:
        return f"Store({str(self._path)!r})"

    def __enter__(self) -> Store:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> Store:
        """Validate the file and create our tables if needed; safe to call repeatedly.

        Returns:
            The store itself.

        Raises:
            StoreError: The path is not writable, or the file is not SQLite, fails
                ``quick_check``, belongs to another application, was written by a newer schema,
                or holds an interrupted transaction. The file is left untouched in every case.

        """
        with self._lock:
            if not self._opened:
                self._prepare_location()
                self._inspect_existing()
                self._create_schema()
                self._opened = True
        return self

    def close(self) -> None:
        """Close the saver's connection, if one was made. The store can still be used."""
        with self._lock:
            saver, self._saver = self._saver, None
        if saver is not None:
            with saver.lock:  # wait for an operation in flight on another thread
                saver.conn.close()

    def saver(self) -> SqliteSaver:
        """The LangGraph checkpointer for this file, shared by all threads.

        Returns:
            A ``SqliteSaver`` on a connection made with ``check_same_thread=False``; the saver
            serialises access with its own lock. Created once per store, closed by
            :meth:`close`.

        Raises:
            StoreError: The checkpoint tables cannot be created.

        """
        self.open()
        with self._lock:
            if self._saver is None:
                from langgraph.checkpoint.sqlite import SqliteSaver

                from rubric_core.redact import RedactingSerializer

                try:
                    conn = sqlite3.connect(
                        self._path, timeout=_TIMEOUT_S, check_same_thread=False
                    )
                except sqlite3.Error as exc:
                    raise self._error(exc) from exc
                # Checkpoints never hold a secret (an echoed key in an error, say).
                saver = SqliteSaver(conn, serde=RedactingSerializer())
                try:
                    saver.setup()
                except sqlite3.Error as exc:
                    conn.close()
                    raise self._error(exc) from exc
                self._saver = saver
            return self._saver

    # -- runs -----------------------------------------------------------------------------------

    def create_run(
        self, settings: RunSettings | None = None, /, *, thread_id: str | None = None,
        **fields: Any,
    ) -> RunRecord:
        """Add a run in status ``running``.

        Only the settings are stored, and settings never hold a credential.

        Args:
            settings: The run's description (already scrubbed of secrets by the caller:
                `rubric_core.session.start` stores ``settings.redacted()``).
            thread_id: LangGraph thread id; defaults to the new run id.
            **fields: Instead of ``settings``: `RunSettings` fields by name (``title``,
                ``prompt``, ``rubric``, ``worker_model``, ...), for scripts and tests.

        Returns:
            The stored record.

        Raises:
            TypeError: Both ``settings`` and fields, an unknown field, or a wrong type.
            ValueError: Settings that cannot run (`RunSettings.validate`).

        """
        if settings is None:
            settings = RunSettings(**fields)
        elif fields:
            msg = f"give settings or fields, not both (got {sorted(fields)})"
            raise TypeError(msg)
        if not isinstance(settings, RunSettings):
            msg = f"settings must be RunSettings, got {type(settings).__name__}"
            raise TypeError(msg)
        settings.validate()
        run_id = uuid.uuid4().hex
        now = _now()
        record = RunRecord(
            run_id=run_id, thread_id=thread_id or run_id, title=settings.title,
            prompt=settings.prompt, rubric=settings.rubric, worker_model=settings.worker_model,
            grader_model=settings.grader_model, max_iterations=settings.max_iterations,
            status="running", created_at=now, updated_at=now, duration_s=None, iterations=0,
            input_tokens=None, output_tokens=None, error=None,
            worker_system_prompt=settings.worker_system_prompt,
            grader_system_prompt=settings.grader_system_prompt,
            grader_tools=settings.grader_tools, settings=settings,
        )
        values = _row(record)
        with self._connect(write=True) as conn:
            conn.execute(
                f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({', '.join('?' * len(values))})",
                values,
            )
        return record

    def add_evaluation(self, run_id: str, evaluation: RubricEvaluation) -> int:
        """Record one grader pass and refresh the run's totals (and status, when it ends it).

        Args:
            run_id: The run graded.
            evaluation: The evaluation as the middleware recorded it.

        Returns:
            The evaluation's 0-based sequence number within the run.

        Raises:
            KeyError: No such run.

        """
        ev = cast("dict[str, Any]", evaluation)
        _check_status(ev["status"])
        now = _now()
        with self._connect(write=True) as conn:
            self._require_run(conn, run_id)
            (seq,) = conn.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM evaluations WHERE run_id = ?", (run_id,)
            ).fetchone()
            conn.execute(
                "INSERT INTO evaluations (run_id, seq, grading_run_id, iteration, result, "
                "status, explanation, criteria_json, answer, duration_s, input_tokens, "
                "output_tokens, unverified) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id, seq, ev["grading_run_id"], ev["iteration"], ev["result"],
                    ev["status"], ev.get("explanation", ""),
                    json.dumps(ev.get("criteria", []), ensure_ascii=False),
                    ev.get("answer", ""), ev.get("duration_s"), ev.get("input_tokens"),
                    ev.get("output_tokens"), int(bool(ev.get("unverified", False))),
                ),
            )
            # A pass that ends the grading run sets the run's status; one that asks for a
            # revision leaves it as it is (``running``): a run's status is its lifecycle.
            status = ev["status"] if ev["status"] in TERMINAL_STATUSES else None
            conn.execute(
                "UPDATE runs SET iterations = ?, status = COALESCE(?, status), updated_at = ?, "
                "input_tokens = (SELECT SUM(input_tokens) FROM evaluations WHERE run_id = ?), "
                "output_tokens = (SELECT SUM(output_tokens) FROM evaluations WHERE run_id = ?) "
                "WHERE run_id = ?",
                (seq + 1, status, now, run_id, run_id, run_id),
            )
        return int(seq)

    def finish_run(
        self,
        run_id: str,
        status: str,
        *,
        error: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        """Set a run's final status.

        Args:
            run_id: The run.
            status: One of :data:`RUN_STATUSES`.
            error: A message for runs that ended in ``error`` (never a credential).
            duration_s: Wall-clock seconds of the run; kept unchanged when None.

        Raises:
            KeyError: No such run.

        """
        _check_status(status)
        with self._connect(write=True) as conn:
            self._require_run(conn, run_id)
            conn.execute(
                "UPDATE runs SET status = ?, error = ?, updated_at = ?, "
                "duration_s = COALESCE(?, duration_s) WHERE run_id = ?",
                (status, error, _now(), duration_s, run_id),
            )

    def touch_run(self, run_id: str, *, duration_s: float | None = None) -> None:
        """The owner's heartbeat: refresh a running run's ``updated_at`` and duration so far.

        Any other status is left alone (the run has ended meanwhile).
        """
        with self._connect(write=True) as conn:
            conn.execute(
                "UPDATE runs SET updated_at = ?, duration_s = COALESCE(?, duration_s) "
                "WHERE run_id = ? AND status = 'running'",
                (_now(), duration_s, run_id),
            )

    def interrupt_stale_runs(self, *, updated_before: str, keep: Collection[str] = ()) -> int:
        """Mark ``interrupted`` the ``running`` runs not updated since ``updated_before``.

        Args:
            updated_before: An ISO 8601 UTC timestamp, as the store writes them.
            keep: Runs to leave alone (those this process is recording).

        Returns:
            How many runs were marked.

        """
        keep = list(keep)
        sql = "UPDATE runs SET status = 'interrupted' WHERE status = 'running' AND updated_at < ?"
        if keep:
            sql += f" AND run_id NOT IN ({', '.join('?' * len(keep))})"
        with self._connect(write=True) as conn:
            return int(conn.execute(sql, [updated_before, *keep]).rowcount)

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run with this id, or None."""
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        return _record(row) if row else None

    def latest_run_for_thread(self, thread_id: str) -> RunRecord | None:
        """The most recent run on this LangGraph thread, or None."""
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE thread_id = ? "
                "ORDER BY created_at DESC, rowid DESC LIMIT 1", (thread_id,)
            ).fetchone()
        return _record(row) if row else None

    def list_runs(
        self,
        *,
        status: str | Collection[str] | None = None,
        model: str | None = None,
        text: str | None = None,
        limit: int | None = 100,
        offset: int = 0,
    ) -> list[RunRecord]:
        """Runs from the index, most recent first; checkpoints are never read.

        Args:
            status: Keep runs in this status (or any of these statuses).
            model: Keep runs whose worker or grader model is exactly this.
            text: Keep runs whose title, prompt or rubric contains this, ignoring case.
            limit: At most this many runs; None for all.
            offset: Skip this many runs first (for paging).

        Returns:
            The matching runs.

        """
        where, params = self._filters(status, model, text)
        if (limit is not None and limit < 0) or offset < 0:
            msg = "limit and offset must not be negative"
            raise ValueError(msg)
        sql = (
            f"SELECT {_RUN_COLUMNS} FROM runs{where} "
            "ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?"
        )
        with self._connect() as conn:
            rows = conn.execute(sql, [*params, -1 if limit is None else limit, offset])
            return [_record(row) for row in rows]

    def count_runs(
        self,
        *,
        status: str | Collection[str] | None = None,
        model: str | None = None,
        text: str | None = None,
    ) -> int:
        """How many runs :meth:`list_runs` would find without a limit (same filters)."""
        where, params = self._filters(status, model, text)
        with self._connect() as conn:
            (count,) = conn.execute(f"SELECT COUNT(*) FROM runs{where}", params).fetchone()
        return int(count)

    def evaluations(self, run_id: str) -> list[RubricEvaluation]:
        """A run's evaluations in the order they were recorded (empty for unknown runs)."""
        return self.evaluations_for_runs([run_id])[run_id]

    def evaluations_for_runs(self, run_ids: Iterable[str]) -> dict[str, list[RubricEvaluation]]:
        """Evaluations of many runs in a few queries.

        Args:
            run_ids: The runs wanted.

        Returns:
            Every requested id, in the order given, mapped to its evaluations in record order.

        """
        out: dict[str, list[RubricEvaluation]] = {rid: [] for rid in run_ids}
        ids = list(out)
        with self._connect() as conn:
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                rows = conn.execute(
                    f"SELECT * FROM evaluations WHERE run_id IN ({', '.join('?' * len(chunk))}) "
                    "ORDER BY run_id, seq",
                    chunk,
                )
                for row in rows:
                    out[row["run_id"]].append(_row_to_evaluation(row))
        return out

    def delete_run(self, run_id: str) -> bool:
        """Delete a run's index rows and, unless another run shares it, its thread's checkpoints.

        Returns:
            True when the run existed.

        """
        with self._connect(write=True) as conn:
            row = conn.execute("SELECT thread_id FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                return False
            thread_id = row["thread_id"]
            conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            shared = conn.execute(
                "SELECT 1 FROM runs WHERE thread_id = ? LIMIT 1", (thread_id,)
            ).fetchone()
        if shared is None:
            try:
                self.saver().delete_thread(thread_id)
            except sqlite3.Error as exc:
                raise self._error(exc) from exc
        return True

    # -- rubric library -------------------------------------------------------------------------

    def save_rubric(self, name: str, text: str) -> int:
        """Save a rubric under a name as a new version (`save_rubric_version` without a preset).

        Args:
            name: The rubric's name (surrounding whitespace is ignored).
            text: The rubric text.

        Returns:
            The new version number (1 for a new name); when ``text`` equals the latest
            version, that version's number and nothing is written.

        """
        return self.save_rubric_version(name, text)[0]

    def save_rubric_version(
        self, name: str, text: str, *, settings: RunSettings | None = None
    ) -> tuple[int, bool]:
        """Save a rubric, with the run settings preset that goes with it, as a new version.

        A version is its text and its preset together: when both equal the latest version's,
        nothing is written and that version is kept.

        Args:
            name: The rubric's name (surrounding whitespace is ignored).
            text: The rubric text.
            settings: The preset (prompt, tools, models, cap) to keep beside the text; stored
                scrubbed of secrets (`RunSettings.redacted`), with ``rubric`` set to ``text``.

        Returns:
            The version number (1 for a new name) and whether it was created (False: the
            latest version was identical and is kept).

        Raises:
            ValueError: An empty name or text.
            TypeError: ``settings`` is not `RunSettings`.

        """
        name = name.strip() if isinstance(name, str) else ""
        if not name:
            msg = "a rubric needs a name: give it a short non-empty name"
            raise ValueError(msg)
        if not isinstance(text, str) or not text.strip():
            msg = f"rubric {name!r} is empty: write at least one criterion before saving"
            raise ValueError(msg)
        if settings is not None and not isinstance(settings, RunSettings):
            msg = f"settings must be RunSettings, got {type(settings).__name__}"
            raise TypeError(msg)
        preset = None if settings is None else settings.replace(rubric=text).redacted().to_json()
        now = _now()
        with self._connect(write=True) as conn:
            latest = conn.execute(
                "SELECT version, text, settings_json FROM rubric_versions WHERE name = ? "
                "ORDER BY version DESC LIMIT 1",
                (name,),
            ).fetchone()
            if latest is not None and latest["text"] == text and (
                    preset is None or latest["settings_json"] == preset):
                return int(latest["version"]), False
            version = 1 if latest is None else latest["version"] + 1
            conn.execute(
                "INSERT INTO rubrics (name, created_at, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET updated_at = excluded.updated_at",
                (name, now, now),
            )
            conn.execute(
                "INSERT INTO rubric_versions (name, version, text, created_at, settings_json) "
                "VALUES (?, ?, ?, ?, ?)",
                (name, version, text, now, preset),
            )
        return int(version), True

    def _rubric_version(self, name: str, version: int | None, column: str) -> Any:
        """One column of a saved rubric version (the latest when ``version`` is None).

        Raises:
            KeyError: No such rubric or version.

        """
        sql = f"SELECT {column} FROM rubric_versions WHERE name = ?"
        params: list[Any] = [name.strip()]
        if version is None:
            sql += " ORDER BY version DESC LIMIT 1"
        else:
            sql += " AND version = ?"
            params.append(version)
        with self._connect() as conn:
            row = conn.execute(sql, params).fetchone()
        if row is None:
            which = "" if version is None else f" version {version}"
            msg = f"no saved rubric {name!r}{which}"
            raise KeyError(msg)
        return row[column]

    def load_preset(self, name: str, version: int | None = None) -> RunSettings | None:
        """The run settings preset saved with a rubric version (None when it has none).

        Args:
            name: The rubric's name.
            version: A version number; the latest when None.

        Raises:
            KeyError: No such rubric or version.

        """
        raw = self._rubric_version(name, version, "settings_json")
        return None if raw is None else RunSettings.from_json(raw)

    def list_rubrics(self) -> list[dict[str, Any]]:
        """Saved rubrics by name: ``name``, ``latest_version`` and ``updated_at`` each."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT r.name, MAX(v.version) AS latest_version, r.updated_at FROM rubrics r "
                "JOIN rubric_versions v ON v.name = r.name GROUP BY r.name ORDER BY r.name"
            ).fetchall()
        return [dict(row) for row in rows]

    def load_rubric(self, name: str, version: int | None = None) -> str:
        """The text of a saved rubric.

        Args:
            name: The rubric's name.
            version: A version number; the latest when None.

        Raises:
            KeyError: No such rubric or version.

        """
        return str(self._rubric_version(name, version, "text"))

    def rubric_versions(self, name: str) -> list[dict[str, Any]]:
        """Every version of a rubric, oldest first: ``version``, ``text``, ``created_at``."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT version, text, created_at FROM rubric_versions WHERE name = ? "
                "ORDER BY version",
                (name.strip(),),
            ).fetchall()
        return [dict(row) for row in rows]

    # -- labels ---------------------------------------------------------------------------------

    def set_label(
        self, run_id: str, seq: int, criterion: str, labeller: str, *, agree: bool,
        correct: bool | None = None, note: str = "",
    ) -> CriterionLabel:
        """Record (or replace) a person's label of one criterion verdict.

        Labels are keyed by (run, evaluation ``seq``, criterion, labeller): labelling the same
        verdict again under the same name updates it and keeps its ``created_at``.

        Args:
            run_id: The run.
            seq: The evaluation's 0-based position in the run (`evaluations` order).
            criterion: The criterion's name as the evaluation records it.
            labeller: The person's local name (surrounding whitespace is ignored).
            agree: Whether the person agrees with the grader's verdict.
            correct: The verdict the person says is right (True: pass), or None.
            note: Free text (scrubbed of known secrets).

        Returns:
            The stored label.

        Raises:
            KeyError: No such run, evaluation or criterion.
            ValueError: An empty labeller, or ``agree`` with a ``correct`` verdict that
                contradicts the grader's.

        """
        from rubric_core.redact import redact

        labeller = labeller.strip() if isinstance(labeller, str) else ""
        if not labeller:
            msg = "a label needs the labeller's name: fill in 'Your name'"
            raise ValueError(msg)
        now = _now()
        with self._connect(write=True) as conn:
            row = conn.execute("SELECT criteria_json FROM evaluations WHERE run_id = ? AND "
                               "seq = ?", (run_id, seq)).fetchone()
            if row is None:
                msg = f"no evaluation {seq} in run {run_id!r}"
                raise KeyError(msg)
            verdicts = {c.get("name"): bool(c.get("passed"))
                        for c in json.loads(row["criteria_json"])}
            if criterion not in verdicts:
                msg = f"evaluation {seq} of run {run_id!r} has no criterion {criterion!r}"
                raise KeyError(msg)
            if agree and correct is not None and correct != verdicts[criterion]:
                msg = ("a label that agrees with the grader cannot give another verdict as the "
                       "correct one: mark it 'disagree'")
                raise ValueError(msg)
            conn.execute(
                "INSERT INTO labels (run_id, seq, criterion, labeller, agree, correct, note, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, seq, criterion, labeller) DO UPDATE SET "
                "agree = excluded.agree, correct = excluded.correct, note = excluded.note, "
                "updated_at = excluded.updated_at",
                (run_id, seq, criterion, labeller, int(bool(agree)),
                 None if correct is None else int(bool(correct)), redact(note or ""), now, now),
            )
            stored = conn.execute(
                "SELECT * FROM labels WHERE run_id = ? AND seq = ? AND criterion = ? AND "
                "labeller = ?", (run_id, seq, criterion, labeller)).fetchone()
        return _row_to_label(stored)

    def delete_label(self, run_id: str, seq: int, criterion: str, labeller: str) -> bool:
        """Remove one label; True when it existed."""
        with self._connect(write=True) as conn:
            cursor = conn.execute(
                "DELETE FROM labels WHERE run_id = ? AND seq = ? AND criterion = ? AND "
                "labeller = ?", (run_id, seq, criterion, labeller.strip()))
            return bool(cursor.rowcount)

    def labels(self, run_ids: Iterable[str] | None = None) -> list[CriterionLabel]:
        """Labels of some runs (every label when None), by run, evaluation, criterion, name.

        Args:
            run_ids: The runs wanted; None for all.

        """
        sql = "SELECT * FROM labels"
        order = " ORDER BY run_id, seq, criterion, labeller"
        with self._connect() as conn:
            if run_ids is None:
                return [_row_to_label(r) for r in conn.execute(sql + order)]
            ids = list(dict.fromkeys(run_ids))
            out: list[CriterionLabel] = []
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                where = f" WHERE run_id IN ({', '.join('?' * len(chunk))})"
                out += [_row_to_label(r) for r in conn.execute(sql + where + order, chunk)]
        return sorted(out, key=lambda lb: (lb["run_id"], lb["seq"], lb["criterion"],
                                           lb["labeller"]))

    def runs_for_rubric(self, rubric: str) -> list[RunRecord]:
        """Every run graded against this rubric text, newest first.

        Spaces, tabs and line breaks around the text are ignored.
        """
        blank = " \t\r\n"
        with self._connect() as conn:
            rows = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE trim(rubric, ?) = ? "
                "ORDER BY created_at DESC, rowid DESC", (blank, rubric.strip(blank)))
            return [_record(row) for row in rows]

    # -- datasets -------------------------------------------------------------------------------

    def save_dataset(self, dataset: Dataset, name: str | None = None) -> int:
        """Store a checked dataset (from `rubric_core.datasets.parse_dataset`) as a new version.

        All its rows are written in one transaction, or none are; their text is scrubbed of
        secrets (`rubric_core.redact`) first.

        Args:
            dataset: The parsed dataset.
            name: Store it under this name instead of ``dataset.name``.

        Returns:
            The new version (1 for a new name); when the rows equal the latest version's, that
            version's number and nothing is written.

        """
        name = (name if name is not None else dataset.name).strip()
        if not name:
            msg = "a dataset needs a name: give it a short non-empty name"
            raise ValueError(msg)
        if not dataset.rows:
            msg = f"dataset {name!r} has no rows"
            raise ValueError(msg)
        # Rows are stored scrubbed of secrets, like everything else in this file; a secret or
        # key-shaped token becomes ``[redacted]`` inside its JSON string, which stays valid.
        from rubric_core.redact import redact

        jsonl = redact(dataset.to_jsonl())
        columns = json.dumps(list(dataset.columns), ensure_ascii=False)
        with self._connect(write=True) as conn:
            latest = conn.execute(
                "SELECT version, jsonl, columns_json FROM datasets WHERE name = ? "
                "ORDER BY version DESC LIMIT 1", (name,),
            ).fetchone()
            if latest is not None and (latest["jsonl"], latest["columns_json"]) == (jsonl,
                                                                                      columns):
                return int(latest["version"])
            version = 1 if latest is None else int(latest["version"]) + 1
            conn.execute(
                "INSERT INTO datasets (name, version, jsonl, columns_json, row_count, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (name, version, jsonl, columns, len(dataset.rows), _now()),
            )
        return version

    def list_datasets(self) -> list[DatasetInfo]:
        """The latest version of every stored dataset, by name."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT d.name, d.version, d.row_count, d.columns_json, d.created_at "
                "FROM datasets d WHERE d.version = (SELECT MAX(version) FROM datasets "
                "WHERE name = d.name) ORDER BY d.name"
            ).fetchall()
        return [_dataset_info(row) for row in rows]

    def dataset_versions(self, name: str) -> list[DatasetInfo]:
        """Every stored version of a dataset, oldest first (empty for an unknown name)."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT name, version, row_count, columns_json, created_at FROM datasets "
                "WHERE name = ? ORDER BY version", (name.strip(),),
            ).fetchall()
        return [_dataset_info(row) for row in rows]

    def load_dataset(self, name: str, version: int | None = None) -> tuple[Dataset, int]:
        """A stored dataset and its version number.

        Args:
            name: The dataset's name.
            version: A version; the latest when None.

        Raises:
            KeyError: No such dataset or version.

        """
        sql = "SELECT version, jsonl, columns_json FROM datasets WHERE name = ?"
        params: list[Any] = [name.strip()]
        if version is None:
            sql += " ORDER BY version DESC LIMIT 1"
        else:
            sql += " AND version = ?"
            params.append(version)
        with self._connect() as conn:
            row = conn.execute(sql, params).fetchone()
        if row is None:
            which = "" if version is None else f" version {version}"
            msg = f"no stored dataset {name!r}{which}: see `rubric-studio datasets --db PATH`"
            raise KeyError(msg)
        dataset = rows_from_jsonl(row["jsonl"], name=name.strip())
        columns = tuple(json.loads(row["columns_json"]))
        return dataclasses.replace(dataset, columns=columns), int(row["version"])

    def delete_dataset(self, name: str) -> int:
        """Delete every version of a dataset that no experiment uses.

        Returns:
            How many versions were deleted (0 for an unknown name).

        Raises:
            ValueError: An experiment runs one of its versions (delete the experiment first).

        """
        with self._connect(write=True) as conn:
            used = [r[0] for r in conn.execute(
                "SELECT experiment_id FROM experiments WHERE dataset_name = ? LIMIT 3",
                (name.strip(),))]
            if used:
                msg = (f"dataset {name!r} is used by experiment(s) "
                       f"{', '.join(u[:8] for u in used)}: delete them first")
                raise ValueError(msg)
            return int(conn.execute("DELETE FROM datasets WHERE name = ?",
                                    (name.strip(),)).rowcount)

    # -- experiments ----------------------------------------------------------------------------

    def create_experiment(
        self, *, name: str, dataset_name: str, dataset_version: int,
        configurations: Sequence[ExperimentConfig], repeats: int, row_ids: Sequence[str],
    ) -> ExperimentRecord:
        """Add an experiment and all its cells (pending, each with its own thread), at once.

        Raises:
            ValueError: No configurations or rows, a repeat count below 1.
            KeyError: No such dataset version.

        """
        if not configurations or not row_ids:
            msg = "an experiment needs at least one configuration and one dataset row"
            raise ValueError(msg)
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            msg = "repeats must be a whole number of at least 1"
            raise ValueError(msg)
        now = _now()
        record = ExperimentRecord(
            experiment_id=uuid.uuid4().hex, name=name.strip() or dataset_name,
            dataset_name=dataset_name, dataset_version=dataset_version,
            configurations=tuple(configurations), repeats=repeats, status="running",
            created_at=now, updated_at=now,
        )
        configs = json.dumps([c.to_dict() for c in configurations], ensure_ascii=False)
        cells = [
            (record.experiment_id, seq, row_id, ci, ri, uuid.uuid4().hex)
            for seq, (ri, ci, row_id) in enumerate(
                (ri, ci, row_id) for ri in range(repeats) for row_id in row_ids
                for ci in range(len(configurations)))
        ]
        with self._connect(write=True) as conn:
            known = conn.execute("SELECT 1 FROM datasets WHERE name = ? AND version = ?",
                                 (dataset_name, dataset_version)).fetchone()
            if known is None:
                msg = f"no stored dataset {dataset_name!r} version {dataset_version}"
                raise KeyError(msg)
            conn.execute(
                "INSERT INTO experiments (experiment_id, name, dataset_name, dataset_version, "
                "configs_json, repeats, status, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (record.experiment_id, record.name, dataset_name, dataset_version, configs,
                 repeats, record.status, now, now),
            )
            conn.executemany(
                "INSERT INTO experiment_cells (experiment_id, seq, row_id, config_index, "
                "repeat_index, thread_id) VALUES (?, ?, ?, ?, ?, ?)", cells,
            )
        return record

    def get_experiment(self, experiment_id: str) -> ExperimentRecord | None:
        """The experiment with this id, or None."""
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM experiments WHERE experiment_id = ?",
                               (experiment_id,)).fetchone()
        return _experiment(row) if row else None

    def list_experiments(self, *, limit: int | None = 100) -> list[ExperimentRecord]:
        """Experiments, most recent first."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT * FROM experiments ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (-1 if limit is None else limit,),
            ).fetchall()
        return [_experiment(row) for row in rows]

    def set_experiment_status(self, experiment_id: str, status: str) -> None:
        """Set an experiment's lifecycle status (`rubric_core.types.EXPERIMENT_STATUSES`)."""
        if status not in EXPERIMENT_STATUSES:
            msg = f"unknown experiment status {status!r}; expected {sorted(EXPERIMENT_STATUSES)}"
            raise ValueError(msg)
        with self._connect(write=True) as conn:
            conn.execute("UPDATE experiments SET status = ?, updated_at = ? "
                         "WHERE experiment_id = ?", (status, _now(), experiment_id))

    def delete_experiment(self, experiment_id: str) -> bool:
        """Delete an experiment and its cells; its runs stay in the run index (and Review)."""
        with self._connect(write=True) as conn:
            return bool(conn.execute("DELETE FROM experiments WHERE experiment_id = ?",
                                     (experiment_id,)).rowcount)

    def experiment_cells(self, experiment_id: str) -> list[CellRecord]:
        """Every cell of an experiment with its run (the latest on its thread), in run order."""
        columns = ", ".join(f"r.{c}" for c in _RUN_COLUMNS.split(", "))
        with self._connect() as conn:
            rows = conn.execute(
                f"SELECT c.row_id, c.config_index, c.repeat_index, c.thread_id, {columns} "
                "FROM experiment_cells c LEFT JOIN runs r ON r.rowid = (SELECT rowid FROM runs "
                "WHERE thread_id = c.thread_id ORDER BY created_at DESC, rowid DESC LIMIT 1) "
                "WHERE c.experiment_id = ? ORDER BY c.seq", (experiment_id,),
            ).fetchall()
        return [
            CellRecord(experiment_id=experiment_id, row_id=row[0], config_index=row[1],
                       repeat_index=row[2], thread_id=row[3],
                       run=_record(tuple(row)[4:]) if row[4] is not None else None)
            for row in rows
        ]

    def renew_cell_thread(self, experiment_id: str, key: tuple[str, int, int]) -> str:
        """Give a cell a fresh thread, so that its next run starts over (a retry).

        The old run stays in the index; the cell's run is the one on the new thread.

        Returns:
            The new thread id.

        Raises:
            KeyError: No such cell.

        """
        thread_id = uuid.uuid4().hex
        with self._connect(write=True) as conn:
            changed = conn.execute(
                "UPDATE experiment_cells SET thread_id = ? WHERE experiment_id = ? AND "
                "row_id = ? AND config_index = ? AND repeat_index = ?",
                (thread_id, experiment_id, *key),
            ).rowcount
        if not changed:
            msg = f"no cell {key} in experiment {experiment_id!r}"
            raise KeyError(msg)
        return thread_id

    # -- private --------------------------------------------------------------------------------

    @contextmanager
    def _connect(self, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A short-lived connection; with ``write``, one IMMEDIATE transaction around the body."""
        self.open()
        try:
            conn = sqlite3.connect(self._path, timeout=_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.create_function("rs_fold", 1, _fold, deterministic=True)
            if write:
                # IMMEDIATE takes the write lock up front, so read-then-insert cannot race.
                conn.execute("BEGIN IMMEDIATE")
            yield conn
            if conn.in_transaction:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise self._error(exc) from exc
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    @staticmethod
    def _require_run(conn: sqlite3.Connection, run_id: str) -> None:
        if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
            msg = f"no run with id {run_id!r}"
            raise KeyError(msg)

    @staticmethod
    def _filters(
        status: str | Collection[str] | None, model: str | None, text: str | None
    ) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            for s in statuses:
                _check_status(s)
            clauses.append(f"status IN ({', '.join('?' * len(statuses))})" if statuses else "0")
            params.extend(statuses)
        if model:
            clauses.append("(worker_model = ? OR grader_model = ?)")
            params.extend([model, model])
        if text:
            # casefold in Python: SQLite's LIKE and lower() only fold ASCII.
            clauses.append(
                "(instr(rs_fold(title), ?) OR instr(rs_fold(prompt), ?) "
                "OR instr(rs_fold(rubric), ?))"
            )
            params.extend([text.casefold()] * 3)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params

    def _unwritable(self, reason: str) -> StoreError:
        return StoreError(
            f"Cannot use {self._path} as the Rubric Studio database: {reason}. Set {DB_ENV_VAR} "
            "(or pass --db) to a file path in a directory you can write to "
            f"(for example {DB_ENV_VAR}=~/rubric_studio.sqlite3) and start again."
        )

    def _not_ours(self, reason: str) -> StoreError:
        return StoreError(
            f"{self._path} is not a Rubric Studio database ({reason}). The file was left "
            f"untouched: move it aside or choose another file with {DB_ENV_VAR} or --db."
        )

    def _damaged(self, reason: str) -> StoreError:
        return StoreError(
            f"{self._path} {reason}. The file was left untouched: restore it from a backup or "
            f"choose another file with {DB_ENV_VAR} or --db."
        )

    def _error(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if "not a database" in text or "malformed" in text:
            return self._damaged(f"cannot be read by SQLite ({text})")
        if getattr(exc, "sqlite_errorcode", None) == _SQLITE_READONLY_ROLLBACK:
            return StoreError(
                f"{self._path} has an unfinished transaction in {self._path.name}-journal, left "
                "by a program that stopped while writing it, and SQLite can only roll it back "
                "by writing to the file. The file was left untouched: if you trust the file, "
                f"roll the transaction back with `sqlite3 {shlex.quote(str(self._path))} 'PRAGMA "
                f"quick_check'` and start again, or choose another file with {DB_ENV_VAR} or --db."
            )
        if "readonly" in text or "unable to open" in text:
            return self._unwritable(text)
        if "locked" in text or "busy" in text:
            return StoreError(
                f"The database {self._path} stayed locked by another process for "
                f"{_TIMEOUT_S:.0f} s ({text}). Try again, or stop the other process."
            )
        return StoreError(f"Database error on {self._path}: {text}")

    def _prepare_location(self) -> None:
        path = self._path
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
            raise self._unwritable(
                msg
            ) from exc
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            msg = "the file is not readable and writable by this user"
            raise self._unwritable(msg)
        # SQLite writes its journal / WAL files next to the database.
        if not os.access(path.parent, os.W_OK | os.X_OK):
            msg = f"the directory {path.parent} is not writable"
            raise self._unwritable(msg)

    def _inspect_existing(self) -> None:
        """Refuse a file that is not ours to write, before any connection can write to it.

        Reads only, and creates no side files: the header with plain file reads (SQLite magic,
        application_id), then a read-only connection for our ``meta`` table and ``quick_check``.
        An empty or absent file passes: it becomes ours.
        """
        path = self._path
        try:
            with path.open("rb") as fh:
                header = fh.read(_HEADER_SIZE)
        except FileNotFoundError:
            return
        except OSError as exc:
            msg = f"the file cannot be read ({exc.strerror or exc})"
            raise self._unwritable(msg) from exc
        if not header:
            return
        # Mid-transaction the file's own bytes may be half-written: then SQLite judges it.
        if not _journal_pending(path):
            if len(header) < _HEADER_SIZE or not header.startswith(_SQLITE_HEADER):
                msg = "it is not a SQLite database at all"
                raise self._not_ours(msg)
            at = _APPLICATION_ID_AT
            self._check_application_id(int.from_bytes(header[at : at + 4], "big", signed=True))
        try:
            conn = sqlite3.connect(
                _read_only_uri(path), uri=True, timeout=_TIMEOUT_S, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            self._identify(conn)
            problem = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        finally:
            conn.close()
        if problem != "ok":
            first = " ".join(str(problem).replace("*** in database main ***", "").split())
            msg = f"failed SQLite's integrity check (quick_check: {first[:200]})"
            raise self._damaged(msg)

    def _check_application_id(self, app_id: int) -> None:
        if app_id not in (0, APPLICATION_ID):
            msg = (
                f"it belongs to another application: its SQLite application_id is "
                f"{app_id & 0xFFFFFFFF:#010x}, Rubric Studio's is {APPLICATION_ID:#010x}"
            )
            raise self._not_ours(
                msg
            )

    def _identify(self, conn: sqlite3.Connection) -> None:
        """Raise unless the non-empty database on ``conn`` is ours at a schema we can read."""
        (app_id,) = conn.execute("PRAGMA application_id").fetchone()
        self._check_application_id(app_id)
        tables = sorted(
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        )
        if "meta" not in tables:
            if app_id == APPLICATION_ID:
                msg = "carries Rubric Studio's application_id but has no meta table"
                raise self._damaged(msg)
            shown = ", ".join(repr(t) for t in tables[:5]) + (", …" if len(tables) > 5 else "")
            msg = (
                "it belongs to another application: it has no Rubric Studio meta table and "
                f"its tables are {shown or 'none'}"
            )
            raise self._not_ours(
                msg
            )
        columns = {row[1] for row in conn.execute("PRAGMA table_info(meta)")}
        meta = (
            dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if {"key", "value"} <= columns
            else {}
        )
        if meta.get("app") != APP_ID:
            msg = (
                "it belongs to another application: its 'meta' table was not made by "
                "Rubric Studio"
            )
            raise self._not_ours(
                msg
            )
        raw = meta.get("schema_version", "0")
        try:
            version = int(raw)
        except (TypeError, ValueError):
            msg = f"has an unreadable schema_version {raw!r}"
            raise self._damaged(msg) from None
        if version > SCHEMA_VERSION:
            msg = (
                f"{self._path} was written by a newer Rubric Studio (schema {version}; this "
                f"version reads up to {SCHEMA_VERSION}). The file was left untouched: upgrade "
                f"Rubric Studio or choose another file with {DB_ENV_VAR} or --db."
            )
            raise StoreError(
                msg
            )

    def _create_schema(self) -> None:
        """Create or upgrade our tables and mark the file as ours, in one transaction."""
        try:
            conn = sqlite3.connect(self._path, timeout=_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            conn.execute("BEGIN IMMEDIATE")
            # Again under the write lock, as the file may have changed since it was inspected.
            # A new database stays 0 bytes on disk until the first commit.
            if self._path.stat().st_size:
                self._identify(conn)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            for statement in _SCHEMA:
                conn.execute(statement)
            # Upgrade an older file: add the columns it lacks (existing rows get NULL).
            have = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
            for column, sql_type in _ADDED_RUN_COLUMNS.items():
                if column not in have:
                    conn.execute(f"ALTER TABLE runs ADD COLUMN {column} {sql_type}")
            have_v = {r[1] for r in conn.execute("PRAGMA table_info(rubric_versions)")}
            for column, sql_type in _ADDED_VERSION_COLUMNS.items():
                if column not in have_v:
                    conn.execute(f"ALTER TABLE rubric_versions ADD COLUMN {column} {sql_type}")
            if "settings_json" not in have:
                # Before schema 3 a run whose process died between passes was left in
                # needs_revision, where nothing offered to resume it.
                conn.execute("UPDATE runs SET status = 'interrupted' "
                             "WHERE status = 'needs_revision'")
            conn.executemany(
                "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                [("app", APP_ID), ("created_at", _now())],
            )
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            conn.execute("COMMIT")
            # WAL lets the app read while a run writes; it is a property of the file. Switched
            # after the first commit, so an interrupted creation rolls back to an empty file.
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise self._error(exc) from exc
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
    in_use = real.with_name(real.name + "-wal").exists() or _journal_pending(real)
    query = "mode=ro" if in_use else "mode=ro&immutable=1"
    return f"file:{urllib.parse.quote(str(real))}?{query}"


def _journal_pending(path: Path) -> bool:
    """Whether a rollback journal beside ``path`` may hold a transaction (live or interrupted)."""
    real = path.resolve()
    journal = real.with_name(real.name + "-journal")
    return journal.is_file() and journal.stat().st_size > 0
