"""The store's API, written once for both databases: run index, library, experiments.

`Store` picks its backend from the location it is given: a ``postgresql://`` (or
``postgres://``) URL is PostgreSQL (`rubric_core.store._postgres`), anything else a SQLite file
(`rubric_core.store._sqlite`). Both hold the same things:

- LangGraph's checkpoint tables, written by the saver that :meth:`Store.saver` returns
  (``SqliteSaver`` or ``PostgresSaver``, both scrubbing secrets), keyed by each run's
  ``thread_id``;
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
  cell's status and results are its run's, read from ``runs``: one shape, no second copy) and
  the lease of the worker running it (`Store.claim_cell`);
- ``meta``: which application owns the database and its schema version
  (`rubric_core.store._schema`).

Every write is one transaction (``BEGIN IMMEDIATE`` on SQLite; on PostgreSQL a transaction,
with a row or advisory lock where an operation reads before it writes). A ``Store`` may be
cached and shared across threads. API keys are never stored: :meth:`Store.create_run` stores a
`rubric_core.settings.RunSettings`, which holds none.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from rubric_core.datasets import Dataset, rows_from_jsonl
from rubric_core.redact import redact
from rubric_core.settings import ExperimentConfig, RunSettings
from rubric_core.store._async_saver import in_thread
from rubric_core.store._pg_url import is_url, mask_url
from rubric_core.store._postgres import PostgresBackend
from rubric_core.store._schema import DB_ENV_VAR, SCHEMA_VERSION, StoreError, search_text
from rubric_core.store._sqlite import SqliteBackend
from rubric_core.types import CELL_PENDING, EXPERIMENT_STATUSES, RUN_STATUSES, TERMINAL_STATUSES

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Sequence
    from contextlib import AbstractContextManager

    from langgraph.checkpoint.base import BaseCheckpointSaver

    from rubric_core.store._schema import Tx
    from rubric_core.types import CriterionLabel, CriterionVerdict, RubricEvaluation

T = TypeVar("T")

__all__ = ["SCHEMA_VERSION", "CellOutcome", "CellRecord", "DatasetInfo", "ExperimentRecord",
           "PassVerdicts", "RunRecord", "RunTakenOver", "Store", "StoreError", "default_db_path",
           "shown_location"]


class RunTakenOver(StoreError):
    """A recorder wrote to a run that another server or process has taken over (resumed)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"Run {run_id[:8]} was taken over by another server or process (it "
                         "found this one silent and resumed it); this one stopped recording it.")

LABEL_NOTE_CHAR_LIMIT = 2_000
"""The most characters a label's note may hold (`Store.set_label` refuses a longer one)."""

_CHUNK = 300  # ids per IN (...) query, well under either database's parameter limit
_CLAIM_TRIES = 200
_CLAIM_RETRY_S = 0.01
_NO_LIMIT = 2**63 - 1  # LIMIT for "all rows": SQLite takes no NULL there, PostgreSQL no -1


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
    owner: str | None = None
    """Who records the run now (``host:pid:id`` of a session); None for runs stored before
    schema 7 or by scripts. Only the owner's heartbeat, evaluations and ending are written."""
    observed_at: str | None = dataclasses.field(default=None, compare=False)
    """When the store read this record, by the database's clock (`Store.now`); not a column.
    With `updated_at` it tells how long ago the run's owner last beat."""

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
    lease_owner: str | None = None
    """The worker holding the cell's lease (`Store.claim_cell`), or None; may have expired."""
    lease_expires_at: float | None = None
    """When that lease expires, in Unix seconds by the database's clock, or None."""

    @property
    def status(self) -> str:
        """The run's stored status, or ``pending`` (`rubric_core.types.CELL_PENDING`)."""
        return self.run.status if self.run is not None else CELL_PENDING

    @property
    def key(self) -> tuple[str, int, int]:
        """``(row_id, config_index, repeat_index)``: the cell's identity in its experiment."""
        return self.row_id, self.config_index, self.repeat_index


PassVerdicts = tuple[str, list["CriterionVerdict"]]
"""One grader pass as the result tables read it: its result and its criterion verdicts."""


class CellOutcome(NamedTuple):
    """A cell as the result tables read it: its run's totals and its last grading run's passes.

    What `Store.cell_outcomes` returns: unlike `CellRecord`, no `RunSettings` is decoded and
    no answer or explanation is read (most of what a cell costs to read), so an experiment of
    thousands of cells is read in one query. A named tuple, not a dataclass: a read builds
    thousands, and a tuple is built in a third of the time.
    """

    row_id: str
    """The dataset row's id."""
    config_index: int
    """0-based index into `ExperimentRecord.configurations`."""
    repeat_index: int
    """0-based repeat."""
    run_id: str | None
    """The cell's run (the latest on its thread), or None before it started."""
    status: str
    """The run's status, or ``pending`` (`rubric_core.types.CELL_PENDING`)."""
    iterations: int
    """Evaluations the run recorded, over all its grading runs (0 before it started)."""
    input_tokens: int | None
    """The run's grader input tokens (None when never reported)."""
    output_tokens: int | None
    """The run's grader output tokens (None when never reported)."""
    duration_s: float | None
    """Wall-clock seconds of the run, once finished."""
    passes: tuple[PassVerdicts, ...] = ()
    """With ``verdicts=True``: the passes of the run's last grading run, in order (empty before
    it graded anything, and without ``verdicts``)."""

    @property
    def key(self) -> tuple[str, int, int]:
        """``(row_id, config_index, repeat_index)``: the cell's identity in its experiment."""
        return self.row_id, self.config_index, self.repeat_index


_NOT_COLUMNS = frozenset({"observed_at"})
_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunRecord) if f.name not in _NOT_COLUMNS)
_COLUMN_OF = {"settings": "settings_json"}
_RUN_COLUMNS = ", ".join(_COLUMN_OF.get(name, name) for name in _RUN_FIELDS)
_LATEST_RUN = ("SELECT rowid FROM runs WHERE thread_id = c.thread_id "
               "ORDER BY created_at DESC, rowid DESC LIMIT 1")
"""The rowid of the latest run on a cell's thread (``c``): the cell's run."""


def _record(row: Sequence[Any], observed_at: str | None = None) -> RunRecord:
    """A run index row (columns in ``_RUN_COLUMNS`` order) as a record."""
    values: dict[str, Any] = dict(zip(_RUN_FIELDS, row, strict=True))
    values["observed_at"] = observed_at
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


def _check_lease(lease_s: float) -> None:
    if isinstance(lease_s, bool) or not isinstance(lease_s, int | float) or not lease_s > 0:
        msg = f"lease_s must be a positive number of seconds, got {lease_s!r}"
        raise ValueError(msg)


def _labeller(name: object) -> str:
    """A labeller's name as labels are keyed by it: stripped and scrubbed of secrets."""
    name = redact(name.strip()) if isinstance(name, str) else ""
    if not name:
        msg = "a label needs the labeller's name: fill in 'Your name'"
        raise ValueError(msg)
    return name


def _check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        msg = f"unknown run status {status!r}; expected one of {sorted(RUN_STATUSES)}"
        raise ValueError(msg)


_EVALUATION_COLUMNS = frozenset({
    "grading_run_id", "iteration", "result", "explanation", "criteria", "status", "unverified",
    "duration_s", "input_tokens", "output_tokens", "answer"})
"""Evaluation keys with a column of their own; every other key is kept in ``extra_json``."""


def _row_to_evaluation(row: Any) -> RubricEvaluation:
    extra = json.loads(row["extra_json"]) if row["extra_json"] else {}
    return cast(
        "RubricEvaluation",
        {
            **{k: v for k, v in extra.items() if k not in _EVALUATION_COLUMNS},
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


def _row_to_label(row: Any) -> CriterionLabel:
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


def _dataset_info(row: Any) -> DatasetInfo:
    return DatasetInfo(name=row["name"], version=int(row["version"]),
                       row_count=int(row["row_count"]),
                       columns=tuple(json.loads(row["columns_json"])),
                       created_at=row["created_at"])


def _experiment(row: Any) -> ExperimentRecord:
    configs = tuple(ExperimentConfig.from_dict(c) for c in json.loads(row["configs_json"]))
    return ExperimentRecord(
        experiment_id=row["experiment_id"], name=row["name"], dataset_name=row["dataset_name"],
        dataset_version=int(row["dataset_version"]), configurations=configs,
        repeats=int(row["repeats"]), status=row["status"], created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class Store:
    """The Rubric Studio database: run index, rubric library and LangGraph checkpoints.

    Nothing touches the database until :meth:`open` (or the first operation, which opens
    lazily). Use it as a context manager to close the saver's connections when done::

        with Store(default_db_path()) as store:
            run = store.create_run(title="t", prompt="p", rubric="- r", worker_model="w",
                                   grader_model="g", max_iterations=3)

    Args:
        path: A SQLite file (created, with its parent directories, on first open), or a
            ``postgresql://user:password@host:port/dbname`` URL (``postgres://`` too) naming
            an empty database or one of ours (`rubric_core.store._postgres`).

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

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._backend.dialect.name

    def __repr__(self) -> str:
        return f"Store({self.location!r})"

    def __enter__(self) -> Store:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- lifecycle ------------------------------------------------------------------------------

    def now(self) -> str:
        """The current time as the store writes it (ISO 8601 UTC), by the database's clock.

        On PostgreSQL the server's clock (`PostgresBackend.clock_offset_s`), so processes on
        several machines write and judge run heartbeats alike; on SQLite this machine's.
        """
        self.open()  # a database that is not ours is refused before it is asked the time
        offset = self._backend.clock_offset_s()
        moment = datetime.now(UTC) + timedelta(seconds=offset)
        return moment.isoformat(timespec="microseconds")

    def open(self) -> Store:
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
            Created once per store (its tables on first use), closed by :meth:`close`.

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

    # -- runs -----------------------------------------------------------------------------------

    def create_run(
        self, settings: RunSettings | None = None, /, *, thread_id: str | None = None,
        owner: str | None = None, **fields: Any,
    ) -> RunRecord:
        """Add a run in status ``running``.

        Only the settings are stored, and settings never hold a credential.

        Args:
            settings: The run's description (already scrubbed of secrets by the caller:
                `rubric_core.session.start` stores ``settings.redacted()``).
            thread_id: LangGraph thread id; defaults to the new run id.
            owner: Who records the run (`RunRecord.owner`); None for no fencing.
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
        now = self.now()
        record = RunRecord(
            run_id=run_id, thread_id=thread_id or run_id, title=settings.title,
            prompt=settings.prompt, rubric=settings.rubric, worker_model=settings.worker_model,
            grader_model=settings.grader_model, max_iterations=settings.max_iterations,
            status="running", created_at=now, updated_at=now, duration_s=None, iterations=0,
            input_tokens=None, output_tokens=None, error=None,
            worker_system_prompt=settings.worker_system_prompt,
            grader_system_prompt=settings.grader_system_prompt,
            grader_tools=settings.grader_tools, settings=settings, owner=owner, observed_at=now,
        )
        values = (*_row(record), search_text(record.title, record.prompt, record.rubric))
        with self._connect(write=True) as conn:
            conn.execute(
                f"INSERT INTO runs ({_RUN_COLUMNS}, search_text) "
                f"VALUES ({', '.join('?' * len(values))})",
                values,
            )
        return record

    def add_evaluation(self, run_id: str, evaluation: RubricEvaluation, *,
                       owner: str | None = None) -> int:
        """Record one grader pass and refresh the run's totals (and status, when it ends it).

        Args:
            run_id: The run graded.
            evaluation: The evaluation as the middleware recorded it.
            owner: The recorder; the pass is refused when another owner holds the run now.

        Returns:
            The evaluation's 0-based sequence number within the run.

        Raises:
            KeyError: No such run.
            RunTakenOver: ``owner`` no longer holds the run (nothing is written).

        """
        ev = cast("dict[str, Any]", evaluation)
        _check_status(ev["status"])
        now = self.now()
        with self._connect(write=True) as conn:
            # One pass at a time takes the next seq; a former owner's pass is refused.
            self._require_run(conn, run_id, lock=True, owner=owner)
            (seq,) = conn.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM evaluations WHERE run_id = ?", (run_id,)
            ).fetchone()
            extra = {k: v for k, v in ev.items() if k not in _EVALUATION_COLUMNS}
            conn.execute(
                "INSERT INTO evaluations (run_id, seq, grading_run_id, iteration, result, "
                "status, explanation, criteria_json, answer, duration_s, input_tokens, "
                "output_tokens, unverified, extra_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id, seq, ev["grading_run_id"], ev["iteration"], ev["result"],
                    ev["status"], ev.get("explanation", ""),
                    json.dumps(ev.get("criteria", []), ensure_ascii=False),
                    ev.get("answer", ""), ev.get("duration_s"), ev.get("input_tokens"),
                    ev.get("output_tokens"), int(bool(ev.get("unverified", False))),
                    json.dumps(extra, ensure_ascii=False, sort_keys=True) if extra else None,
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
        owner: str | None = None,
    ) -> None:
        """Set a run's final status.

        Args:
            run_id: The run.
            status: One of :data:`RUN_STATUSES`.
            error: A message for runs that ended in ``error`` (never a credential).
            duration_s: Wall-clock seconds of the run; kept unchanged when None.
            owner: The recorder; refused when another owner holds the run now.

        Raises:
            KeyError: No such run.
            RunTakenOver: ``owner`` no longer holds the run (nothing is written).

        """
        _check_status(status)
        with self._connect(write=True) as conn:
            self._require_run(conn, run_id, lock=owner is not None, owner=owner)
            conn.execute(
                "UPDATE runs SET status = ?, error = ?, updated_at = ?, "
                "duration_s = COALESCE(?, duration_s) WHERE run_id = ?",
                (status, error, self.now(), duration_s, run_id),
            )

    def touch_run(self, run_id: str, *, duration_s: float | None = None,
                  owner: str | None = None) -> bool:
        """The owner's heartbeat: refresh a running run's ``updated_at`` and duration so far.

        Any other status is left alone (the run has ended meanwhile), and so is a run that
        another owner holds now.

        Returns:
            False when another owner holds the run now (it was taken over: the caller lost
            it); True otherwise, also for a run that has ended.

        Raises:
            KeyError: No such run.

        """
        with self._connect(write=True) as conn:
            try:
                self._require_run(conn, run_id, lock=True, owner=owner)
            except RunTakenOver:
                return False
            conn.execute(
                "UPDATE runs SET updated_at = ?, duration_s = COALESCE(?, duration_s) "
                "WHERE run_id = ? AND status = 'running'",
                (self.now(), duration_s, run_id))
            return True

    def claim_run(self, run_id: str, *, stale_before: str, owner: str | None = None) -> bool:
        """Set a run ``running`` for a new recorder, unless a live one holds it.

        One statement, so of two processes resuming the same run at once only one wins: a run
        is claimed when it is not ``running``, or when its ``running`` row was not touched since
        ``stale_before`` (its owner died). The claimer becomes the run's owner: the former
        owner's heartbeat, passes and ending are refused from then on.

        Args:
            run_id: The run.
            stale_before: An ISO 8601 UTC timestamp by the database's clock (`now`).
            owner: The new recorder.

        Returns:
            True when this caller now holds the run; False when another recorder does.

        Raises:
            KeyError: No such run.

        """
        with self._connect(write=True) as conn:
            self._require_run(conn, run_id)
            return bool(conn.execute(
                "UPDATE runs SET status = 'running', error = NULL, updated_at = ?, owner = ? "
                "WHERE run_id = ? AND (status <> 'running' OR updated_at < ?)",
                (self.now(), owner, run_id, stale_before)).rowcount)

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
        return _record(row, self.now()) if row else None

    def latest_run_for_thread(self, thread_id: str) -> RunRecord | None:
        """The most recent run on this LangGraph thread, or None."""
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE thread_id = ? "
                "ORDER BY created_at DESC, rowid DESC LIMIT 1", (thread_id,)
            ).fetchone()
        return _record(row, self.now()) if row else None

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
            rows = conn.execute(sql, [*params, _NO_LIMIT if limit is None else limit, offset])
            now = self.now()
            return [_record(row, now) for row in rows]

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
            except self._backend.errors as exc:
                raise self._backend.error(exc) from exc
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
        now = self.now()
        with self._connect(write=True) as conn:
            conn.lock(f"rubric:{name}")  # read the latest version, then write the next one
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
            labeller: The person's local name (surrounding whitespace is ignored; stored
                scrubbed of secrets, like the note).
            agree: Whether the person agrees with the grader's verdict.
            correct: The verdict the person says is right (True: pass), or None.
            note: Free text, at most `LABEL_NOTE_CHAR_LIMIT` characters (scrubbed of secrets).

        Returns:
            The stored label.

        Raises:
            KeyError: No such run, evaluation or criterion.
            ValueError: An empty labeller, a note over `LABEL_NOTE_CHAR_LIMIT` characters, or
                ``agree`` with a ``correct`` verdict that contradicts the grader's.

        """
        labeller = _labeller(labeller)
        note = note or ""
        if len(note) > LABEL_NOTE_CHAR_LIMIT:
            msg = (f"a label's note holds at most {LABEL_NOTE_CHAR_LIMIT:,} characters, got "
                   f"{len(note):,}: shorten it")
            raise ValueError(msg)
        note = redact(note)
        now = self.now()
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
                 None if correct is None else int(bool(correct)), note, now, now),
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
                "labeller = ?", (run_id, seq, criterion, _labeller(labeller)))
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
            now = self.now()
            return [_record(row, now) for row in rows]

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
        # Rows are stored scrubbed of secrets, like everything else in this file. Each value is
        # scrubbed before it is written as JSON, not the JSON text after: a secret holding a
        # quote or a backslash is escaped there (so it would not be found), and a replacement
        # could swallow the backslash before a quote and leave a line that no longer parses.
        from rubric_core.redact import redact, secret_values

        known = secret_values()

        def clean(text: str) -> str:
            return redact(text, secrets=known)

        rows = tuple(dataclasses.replace(
            row, id=clean(row.id), prompt=clean(row.prompt),
            rubric=None if row.rubric is None else clean(row.rubric),
            variables={key: clean(value) for key, value in row.variables.items()},
        ) for row in dataset.rows)
        jsonl = dataclasses.replace(dataset, rows=rows).to_jsonl()
        columns = json.dumps(list(dataset.columns), ensure_ascii=False)
        with self._connect(write=True) as conn:
            conn.lock(f"dataset:{name}")  # read the latest version, then write the next one
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
                (name, version, jsonl, columns, len(dataset.rows), self.now()),
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
        now = self.now()
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
                (_NO_LIMIT if limit is None else limit,),
            ).fetchall()
        return [_experiment(row) for row in rows]

    def set_experiment_status(self, experiment_id: str, status: str) -> None:
        """Set an experiment's lifecycle status (`rubric_core.types.EXPERIMENT_STATUSES`)."""
        if status not in EXPERIMENT_STATUSES:
            msg = f"unknown experiment status {status!r}; expected {sorted(EXPERIMENT_STATUSES)}"
            raise ValueError(msg)
        with self._connect(write=True) as conn:
            conn.execute("UPDATE experiments SET status = ?, updated_at = ? "
                         "WHERE experiment_id = ?", (status, self.now(), experiment_id))

    def delete_experiment(self, experiment_id: str) -> bool:
        """Delete an experiment and its cells; its runs stay in the run index (and Review).

        Refused while a worker (in this process or any other sharing the database) holds a
        live lease on one of its cells: Stop it first, or wait for a dead worker's leases to
        expire. A worker that claims a cell as the experiment is deleted loses it at its next
        lease renewal.

        Returns:
            False when there is no such experiment.

        Raises:
            ValueError: The experiment is running (the message says how many cells are leased
                and when the last lease expires).

        """
        with self._connect(write=True) as conn:
            now = conn.dialect.epoch_now
            held, left = conn.execute(
                f"SELECT COUNT(*), MAX(lease_expires_at) - {now} FROM experiment_cells "
                f"WHERE experiment_id = ? AND lease_owner IS NOT NULL "
                f"AND lease_expires_at > {now}", (experiment_id,)).fetchone()
            if held:
                msg = (f"experiment {experiment_id} is running: {held} cell(s) are leased by a "
                       f"worker for up to {float(left):.0f} s more; stop it first (a killed "
                       "worker's leases expire by themselves)")
                raise ValueError(msg)
            return bool(conn.execute("DELETE FROM experiments WHERE experiment_id = ?",
                                     (experiment_id,)).rowcount)

    def experiment_cells(self, experiment_id: str, *, offset: int = 0,
                         limit: int | None = None) -> list[CellRecord]:
        """Cells of an experiment with their runs (the latest on each thread), in run order.

        Args:
            experiment_id: The experiment.
            offset: Skip this many cells first.
            limit: At most this many cells (all when None): a long export reads its cells a
                page at a time, since every record carries its run's whole settings.

        """
        with self._connect() as conn:
            return self._cells(conn, experiment_id, offset=offset, limit=limit, now=self.now())

    @staticmethod
    def _cells(conn: Tx, experiment_id: str, key: tuple[str, int, int] | None = None, *,
               offset: int = 0, limit: int | None = None,
               now: str | None = None) -> list[CellRecord]:
        columns = ", ".join(f"r.{c}" for c in _RUN_COLUMNS.split(", "))
        where, params = "c.experiment_id = ?", [experiment_id, *(key or ())]
        if key is not None:
            where += " AND c.row_id = ? AND c.config_index = ? AND c.repeat_index = ?"
        rows = conn.execute(
            "SELECT c.row_id, c.config_index, c.repeat_index, c.thread_id, c.lease_owner, "
            f"c.lease_expires_at, {columns} "
            f"FROM experiment_cells c LEFT JOIN runs r ON r.rowid = ({_LATEST_RUN}) "
            f"WHERE {where} ORDER BY c.seq LIMIT ? OFFSET ?",
            [*params, _NO_LIMIT if limit is None else limit, offset],
        ).fetchall()
        return [
            CellRecord(experiment_id=experiment_id, row_id=row[0], config_index=row[1],
                       repeat_index=row[2], thread_id=row[3],
                       run=_record(tuple(row)[6:], now) if row[6] is not None else None,
                       lease_owner=row[4], lease_expires_at=row[5])
            for row in rows
        ]

    def cell_outcomes(self, experiment_id: str, *, verdicts: bool = False) -> list[CellOutcome]:
        """Every cell of an experiment with its run's totals, in run order, in one query.

        What result tables need, read without decoding run settings (`experiment_cells` does)
        or reading answers.

        Args:
            experiment_id: The experiment.
            verdicts: Also read each run's last grading run: every pass's result and criterion
                verdicts (`CellOutcome.passes`).

        """
        select = ("SELECT c.seq, c.row_id, c.config_index, c.repeat_index, r.run_id, r.status, "
                  "r.iterations, r.input_tokens, r.output_tokens, r.duration_s")
        joins = f"FROM experiment_cells c LEFT JOIN runs r ON r.rowid = ({_LATEST_RUN})"
        order = "c.seq"
        if verdicts:
            select += ", e.grading_run_id, e.result, e.criteria_json"
            joins += " LEFT JOIN evaluations e ON e.run_id = r.run_id"
            order += ", e.seq"
        with self._connect() as conn:
            rows = conn.execute(f"{select} {joins} WHERE c.experiment_id = ? ORDER BY {order}",
                                (experiment_id,)).fetchall()
        out: list[CellOutcome] = []
        last = len(rows) - 1
        first = 0  # the cell's first row with an evaluation of its last grading run
        for i, row in enumerate(rows):
            if verdicts and i > first and row[10] != rows[i - 1][10]:
                first = i  # a new grading run: the earlier passes are not the last one's
            if i < last and rows[i + 1][0] == row[0]:
                continue  # another pass of the same cell
            passes: tuple[PassVerdicts, ...] = ()
            if verdicts and row[10] is not None:
                passes = tuple((p[11], json.loads(p[12])) for p in rows[first : i + 1])
            out.append(CellOutcome(row[1], row[2], row[3], row[4],
                                   CELL_PENDING if row[4] is None else row[5], row[6] or 0,
                                   row[7], row[8], row[9], passes))
            first = i + 1
        return out

    # -- leases: several workers share an experiment's cells ------------------------------------

    def claim_cell(
        self, experiment_id: str, owner: str, *, lease_s: float, done: Collection[str],
        keys: Collection[tuple[str, int, int]] | None = None,
    ) -> CellRecord | None:
        """Lease one cell that still needs a run to ``owner``, for ``lease_s`` seconds.

        A cell can be claimed when its status (its run's, or ``pending``) is not in ``done``
        and nobody holds a live lease on it (none, released, or expired: a worker that died
        loses its cells when their leases run out). Cells are claimed in run order. Two
        workers claiming at once never get the same cell: on PostgreSQL the claim reads with
        ``SELECT … FOR UPDATE SKIP LOCKED`` (a concurrent claim skips a row being claimed
        instead of waiting for it), on SQLite under the file's one write lock
        (``BEGIN IMMEDIATE``). Leases are judged by the database's clock, so workers on
        several machines need no agreement on time.

        Args:
            experiment_id: The experiment.
            owner: Who claims (unique per worker, e.g. ``host:pid:uuid``); a cell it already
                holds is not handed to it again.
            lease_s: Seconds until the lease expires unless renewed (`renew_lease`).
            done: Cell statuses that need no run (the experiment driver's ended statuses,
                less the error statuses when errors are retried).
            keys: Claim only among these cells (``(row_id, config_index, repeat_index)``),
                e.g. those a worker found unfinished when it started, so that a cell that
                ends in an error is not claimed again at once; None for any cell.

        Returns:
            The claimed cell (with ``lease_owner`` and ``lease_expires_at`` set), or None when
            no cell can be claimed now (every remaining one done or leased).

        Raises:
            ValueError: An empty owner or a lease that is not a positive number of seconds.

        """
        if not isinstance(owner, str) or not owner.strip():
            msg = "a lease needs an owner: a non-empty string naming the worker"
            raise ValueError(msg)
        _check_lease(lease_s)
        chunks: list[list[tuple[str, int, int]] | None] = [None]
        if keys is not None:
            wanted = list(dict.fromkeys((str(r), int(c), int(i)) for r, c, i in keys))
            chunks = [wanted[i : i + _CHUNK // 3] for i in range(0, len(wanted), _CHUNK // 3)]
        with self._connect(write=True) as conn:
            for chunk in chunks:
                key = self._claim(conn, experiment_id, owner, lease_s, done, chunk)
                if key is not None:
                    return self._cells(conn, experiment_id, key)[0]
        return None

    def _claim(self, conn: Tx, experiment_id: str, owner: str, lease_s: float,
               done: Collection[str], keys: list[tuple[str, int, int]] | None,
               ) -> tuple[str, int, int] | None:
        dialect = conn.dialect
        where = ("c.experiment_id = ? AND (c.lease_owner IS NULL OR "
                 f"c.lease_expires_at <= {dialect.epoch_now})")
        params: list[Any] = [experiment_id]
        if done:
            where += (" AND COALESCE((SELECT status FROM runs WHERE thread_id = c.thread_id "
                      "ORDER BY created_at DESC, rowid DESC LIMIT 1), ?) "
                      f"NOT IN ({', '.join('?' * len(done))})")
            params += [CELL_PENDING, *sorted(done)]
        if keys is not None:
            where += (" AND (c.row_id, c.config_index, c.repeat_index) IN (VALUES "
                      + ", ".join(["(?, ?, ?)"] * len(keys)) + ")")
            params += [v for k in keys for v in k]
        claim = (f"SELECT c.row_id, c.config_index, c.repeat_index FROM experiment_cells c "
                 f"WHERE {where} ORDER BY c.seq LIMIT 1{dialect.skip_locked}")
        for _ in range(_CLAIM_TRIES):
            row = conn.execute(claim, params).fetchone()
            if row is not None:
                key = (str(row[0]), int(row[1]), int(row[2]))
                conn.execute(
                    f"UPDATE experiment_cells SET lease_owner = ?, lease_expires_at = "
                    f"{dialect.epoch_now} + ? WHERE experiment_id = ? AND row_id = ? AND "
                    "config_index = ? AND repeat_index = ?",
                    (owner, float(lease_s), experiment_id, *key))
                return key
            # PostgreSQL's LIMIT with a row lock can come back empty when the row it found was
            # claimed meanwhile, though others are free: look again without locking.
            free = conn.execute(
                f"SELECT 1 FROM experiment_cells c WHERE {where} LIMIT 1", params).fetchone()
            if free is None:
                return None
            time.sleep(_CLAIM_RETRY_S)  # another claim holds that row; it commits in a moment
        return None

    def renew_lease(self, experiment_id: str, key: tuple[str, int, int], owner: str, *,
                    lease_s: float) -> bool:
        """Extend ``owner``'s lease on a cell to ``lease_s`` seconds from now.

        Returns:
            False when ``owner`` no longer holds it (it expired and another worker claimed
            it, or it was released): stop working on the cell.

        """
        _check_lease(lease_s)
        with self._connect(write=True) as conn:
            return bool(conn.execute(
                f"UPDATE experiment_cells SET lease_expires_at = {conn.dialect.epoch_now} + ? "
                "WHERE experiment_id = ? AND row_id = ? AND config_index = ? AND "
                "repeat_index = ? AND lease_owner = ?",
                (float(lease_s), experiment_id, *key, owner)).rowcount)

    def leased_elsewhere(self, experiment_id: str, owner: str) -> int:
        """How many of an experiment's cells other workers hold live leases on now."""
        with self._connect() as conn:
            now = conn.dialect.epoch_now
            (held,) = conn.execute(
                f"SELECT COUNT(*) FROM experiment_cells WHERE experiment_id = ? "
                f"AND lease_owner IS NOT NULL AND lease_owner <> ? AND lease_expires_at > {now}",
                (experiment_id, owner)).fetchone()
        return int(held)

    def release_cell(self, experiment_id: str, key: tuple[str, int, int], owner: str) -> bool:
        """Give up ``owner``'s lease on a cell (after its run ended, or on Stop).

        Returns:
            False when ``owner`` did not hold it (nothing is changed then).

        """
        with self._connect(write=True) as conn:
            return bool(conn.execute(
                "UPDATE experiment_cells SET lease_owner = NULL, lease_expires_at = NULL "
                "WHERE experiment_id = ? AND row_id = ? AND config_index = ? AND "
                "repeat_index = ? AND lease_owner = ?", (experiment_id, *key, owner)).rowcount)

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

    def _connect(self, *, write: bool = False) -> AbstractContextManager[Tx]:
        """One operation's connection; with ``write``, one transaction around the body."""
        self.open()
        return cast("AbstractContextManager[Tx]", self._backend.connect(write=write))

    @staticmethod
    def _require_run(conn: Tx, run_id: str, *, lock: bool = False,
                     owner: str | None = None) -> None:
        """Raise KeyError for an unknown run; with ``lock``, hold its row until the end.

        With ``owner``, also raise `RunTakenOver` when another owner holds the run now.
        """
        suffix = conn.dialect.lock_rows if lock else ""
        row = conn.execute(f"SELECT owner FROM runs WHERE run_id = ?{suffix}",
                           (run_id,)).fetchone()
        if row is None:
            msg = f"no run with id {run_id!r}"
            raise KeyError(msg)
        if owner is not None and row[0] is not None and row[0] != owner:
            raise RunTakenOver(run_id)

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
            clauses.append(f"status IN ({', '.join('?' * len(statuses))})" if statuses
                           else "1 = 0")
            params.extend(statuses)
        if model:
            clauses.append("(worker_model = ? OR grader_model = ?)")
            params.extend([model, model])
        if text:
            # search_text is casefolded in Python: neither database's lower() casefolds.
            clauses.append("search_text LIKE ? ESCAPE '\\'")
            escaped = (text.casefold().replace("\\", "\\\\").replace("%", "\\%")
                       .replace("_", "\\_"))
            params.append(f"%{escaped}%")
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params
