"""Experiments: a stored dataset version × configurations × repeats, one cell per run.

``experiments`` holds an experiment's configurations; ``experiment_cells`` one cell per dataset
row × configuration × repeat, each naming the LangGraph thread its run uses. A cell's status and
results are its run's (the latest run on its thread), read from ``runs``: one shape, no second
copy. Results are read whole (`ExperimentStore.experiment_cells`, with each run's settings) or
lean (`ExperimentStore.cell_outcomes`, for the result tables). Which process runs a cell is the
queue engine's business (`rubric_core.engine`), not the store's.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from rubric_core.redact import redact, redact_data, secret_values
from rubric_core.store._core import NO_LIMIT, StoreCore
from rubric_core.store._library import versioned_row
from rubric_core.store._records import (
    RUN_COLUMNS,
    CellOutcome,
    CellRecord,
    EarlierRun,
    ExperimentRecord,
    PassVerdicts,
    cell_from_row,
    experiment_from_row,
    named_rows,
    outcome_from_row,
)
from rubric_core.types import EXPERIMENT_STATUSES

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rubric_core.settings import ExperimentConfig
    from rubric_core.store._schema import Tx

LATEST_RUN = ("SELECT rowid FROM runs WHERE thread_id = c.thread_id "
              "ORDER BY created_at DESC, rowid DESC LIMIT 1")
"""The rowid of the latest run on a cell's thread (``c``): the cell's run."""

_SELECT_CELL = ("c.row_id, c.config_index, c.repeat_index, c.thread_id AS cell_thread_id, "
                + ", ".join(f"r.{c}" for c in RUN_COLUMNS))
"""A cell and its run's columns (`rubric_core.store._records.cell_from_row`)."""


class ExperimentStore(StoreCore):
    """The store's experiments and their cells; a part of `rubric_core.store.Store`."""

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
        # Stored scrubbed of secrets like every text the store keeps (a rubric or system prompt
        # read from a file may hold a key); the record holds what was stored, so the cells run
        # in this process are the ones a Resume elsewhere would run.
        known = secret_values()
        stored = tuple(type(c).from_dict(redact_data(c.to_dict(), secrets=known))
                       for c in configurations)
        record = ExperimentRecord(
            experiment_id=uuid.uuid4().hex, name=redact(name.strip() or dataset_name,
                                                         secrets=known),
            dataset_name=dataset_name, dataset_version=dataset_version,
            configurations=stored, repeats=repeats, status="running",
            created_at=now, updated_at=now,
        )
        configs = json.dumps([c.to_dict() for c in stored], ensure_ascii=False)
        cells = [
            (record.experiment_id, seq, row_id, ci, ri, uuid.uuid4().hex)
            for seq, (ri, ci, row_id) in enumerate(
                (ri, ci, row_id) for ri in range(repeats) for row_id in row_ids
                for ci in range(len(configurations)))
        ]
        with self._connect(write=True) as conn:
            if versioned_row(conn, "datasets", dataset_name, dataset_version, "version") is None:
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
        return experiment_from_row(row) if row else None

    def list_experiments(self, *, limit: int | None = 100) -> list[ExperimentRecord]:
        """Experiments, most recent first."""
        with self._connect() as conn:
            rows = named_rows(conn.execute(
                "SELECT * FROM experiments ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (NO_LIMIT if limit is None else limit,),
            ))
        return [experiment_from_row(row) for row in rows]

    def set_experiment_budget(self, experiment_id: str, budget: dict[str, Any] | None) -> None:
        """Keep (or with None, clear) the budget an experiment runs under, as JSON.

        Raises:
            KeyError: No such experiment.

        """
        # Scrubbed like every text the store keeps (a model name in a price is the person's).
        text = None if budget is None else json.dumps(redact_data(budget), sort_keys=True)
        with self._connect(write=True) as conn:
            changed = conn.execute("UPDATE experiments SET budget_json = ? WHERE "
                                   "experiment_id = ?", (text, experiment_id)).rowcount
        if not changed:
            msg = f"no experiment {experiment_id!r}"
            raise KeyError(msg)

    def set_experiment_status(self, experiment_id: str, status: str) -> None:
        """Set an experiment's lifecycle status (`rubric_core.types.EXPERIMENT_STATUSES`)."""
        if status not in EXPERIMENT_STATUSES:
            msg = f"unknown experiment status {status!r}; expected {sorted(EXPERIMENT_STATUSES)}"
            raise ValueError(msg)
        with self._connect(write=True) as conn:
            conn.execute("UPDATE experiments SET status = ?, updated_at = ? "
                         "WHERE experiment_id = ?", (status, self.now(), experiment_id))

    def delete_experiment(self, experiment_id: str, *, stale_before: str | None = None) -> bool:
        """Delete an experiment and its cells; its runs stay in the run index (and Review).

        Refused while one of its cells' runs is being recorded (``running`` with a heartbeat
        since ``stale_before``), in this process or any other sharing the database: Stop it
        first. A cell the engine starts after the deletion finds no cell and records nothing.

        Args:
            experiment_id: The experiment.
            stale_before: A heartbeat older than this (ISO 8601 by the database's clock:
                `rubric_core.session.stale_before`) is a dead process's: its run does not
                hold the experiment. None: any ``running`` run does.

        Returns:
            False when there is no such experiment.

        Raises:
            ValueError: The experiment is running (the message says how many cells).

        """
        with self._connect(write=True) as conn:
            fresh, params = "", [experiment_id]
            if stale_before is not None:
                fresh, params = " AND r.updated_at >= ?", [experiment_id, stale_before]
            row = conn.execute(
                "SELECT COUNT(*) AS running FROM experiment_cells c JOIN runs r "
                "ON r.thread_id = c.thread_id WHERE c.experiment_id = ? "
                f"AND r.status = 'running'{fresh}", params).fetchone()
            if row["running"]:
                msg = (f"experiment {experiment_id} is running: {row['running']} cell(s) are "
                       "being run by a worker; stop it first (a killed worker's cells stop "
                       "counting once their heartbeat is stale)")
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
        where, params = "c.experiment_id = ?", [experiment_id, *(key or ())]
        if key is not None:
            where += " AND c.row_id = ? AND c.config_index = ? AND c.repeat_index = ?"
        rows = named_rows(conn.execute(
            f"SELECT {_SELECT_CELL} "
            f"FROM experiment_cells c LEFT JOIN runs r ON r.rowid = ({LATEST_RUN}) "
            f"WHERE {where} ORDER BY c.seq LIMIT ? OFFSET ?",
            [*params, NO_LIMIT if limit is None else limit, offset],
        ))
        return [cell_from_row(row, experiment_id, now) for row in rows]

    def cell_outcomes(self, experiment_id: str, *, verdicts: bool = False) -> list[CellOutcome]:
        """Every cell of an experiment with its run's totals, in run order, in one query.

        What result tables need, read without decoding run settings (`experiment_cells` does)
        or reading answers.

        Args:
            experiment_id: The experiment.
            verdicts: Also read each run's last grading run: every pass's result and criterion
                verdicts (`CellOutcome.passes`).

        """
        select = ("SELECT c.seq AS cell_seq, c.row_id, c.config_index, c.repeat_index, "
                  "r.run_id, r.status, r.iterations, r.input_tokens, r.output_tokens, "
                  "r.duration_s, r.cached_input_tokens")
        joins = f"FROM experiment_cells c LEFT JOIN runs r ON r.rowid = ({LATEST_RUN})"
        order = "c.seq"
        if verdicts:
            select += ", e.grading_run_id, e.result, e.criteria_json"
            joins += " LEFT JOIN evaluations e ON e.run_id = r.run_id"
            order += ", e.seq"
        with self._connect() as conn:
            rows = named_rows(conn.execute(
                f"{select} {joins} WHERE c.experiment_id = ? ORDER BY {order}",
                (experiment_id,)))
        out: list[CellOutcome] = []
        last = len(rows) - 1
        first = 0  # the cell's first row with an evaluation of its last grading run
        for i, row in enumerate(rows):
            if verdicts and i > first and (row["grading_run_id"]
                                           != rows[i - 1]["grading_run_id"]):
                first = i  # a new grading run: the earlier passes are not the last one's
            if i < last and rows[i + 1]["cell_seq"] == row["cell_seq"]:
                continue  # another pass of the same cell
            passes: tuple[PassVerdicts, ...] = ()
            if verdicts and row["grading_run_id"] is not None:
                passes = tuple((p["result"], json.loads(p["criteria_json"]))
                               for p in rows[first : i + 1])
            out.append(outcome_from_row(row, passes))
            first = i + 1
        return out

    def renew_cell_thread(self, experiment_id: str, key: tuple[str, int, int]) -> str:
        """Give a cell a fresh thread, so that its next run starts over (a retry).

        The old run stays in the index; the cell's run is the one on the new thread. The old
        thread is kept in ``retired_cell_threads`` (in the same transaction), so the runs on it
        still count in what the experiment spent (`earlier_cell_runs`).

        Returns:
            The new thread id.

        Raises:
            KeyError: No such cell.

        """
        thread_id = uuid.uuid4().hex
        where = "experiment_id = ? AND row_id = ? AND config_index = ? AND repeat_index = ?"
        with self._connect(write=True) as conn:
            old = conn.execute(f"SELECT thread_id FROM experiment_cells WHERE {where}"
                               f"{conn.dialect.lock_rows}", (experiment_id, *key)).fetchone()
            if old is None:
                msg = f"no cell {key} in experiment {experiment_id!r}"
                raise KeyError(msg)
            conn.execute(
                "INSERT INTO retired_cell_threads (thread_id, experiment_id, row_id, "
                "config_index, repeat_index, retired_at) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING", (old[0], experiment_id, *key, self.now()))
            conn.execute(f"UPDATE experiment_cells SET thread_id = ? WHERE {where}",
                         (thread_id, experiment_id, *key))
        return thread_id

    def earlier_cell_runs(self, experiment_id: str) -> list[EarlierRun]:
        """The runs an experiment paid for that are not its cells' runs now, in record order.

        Those on the threads a retry replaced (`renew_cell_thread`), and any but the latest on
        a cell's own thread. One query; no settings are decoded.
        """
        with self._connect() as conn:
            rows = named_rows(conn.execute(
                "SELECT r.run_id, t.row_id, t.config_index, t.repeat_index, r.iterations "
                "FROM (SELECT thread_id, row_id, config_index, repeat_index "
                "FROM retired_cell_threads WHERE experiment_id = ? UNION ALL "
                "SELECT thread_id, row_id, config_index, repeat_index FROM experiment_cells "
                "WHERE experiment_id = ?) t JOIN runs r ON r.thread_id = t.thread_id "
                # Not a cell's run now (NOT EXISTS: a pending cell's run would be a NULL).
                "WHERE NOT EXISTS (SELECT 1 FROM experiment_cells c WHERE c.thread_id = "
                f"r.thread_id AND r.rowid = ({LATEST_RUN})) ORDER BY r.created_at, r.rowid",
                (experiment_id, experiment_id)))
        return [EarlierRun(r["run_id"], r["row_id"], int(r["config_index"]),
                           int(r["repeat_index"]), int(r["iterations"] or 0)) for r in rows]
