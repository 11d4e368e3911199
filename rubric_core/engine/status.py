"""The queue engine seen from any process: a batch's queue state, and Stop from outside.

The app and ``rubric-studio queue`` read DBOS's own tables through its client, which works on
the system database without launching DBOS: reading launches nothing, takes no executor ID,
polls no queue and creates nothing (a database without engine tables raises `NoEngineTables`).
`stop_cells` is `rubric_core.engine.queues.cancel_cells` without a launched engine. A cell
counts once, under its latest attempt; one cancelled whose run ended all the same counts done.
A worker is shown as its process only (``pid N on HOST``): executor IDs are read from a
database any process may write.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubric_core.engine import _dbos
from rubric_core.engine.launch import SYSTEM_SCHEMA, engine_database
from rubric_core.engine.queues import ACTIVE, attempt_of, id_prefix, item_prefix
from rubric_core.registry import describe_owner, owned_here, owner_is_gone

if TYPE_CHECKING:
    from collections.abc import Iterator

    import sqlalchemy as sa

    from rubric_core.store import Store

QUEUED = _dbos.QUEUED
"""DBOS statuses of a cell waiting for a worker."""
RUNNING = _dbos.RUNNING
"""The DBOS status of a cell a worker runs (or ran, if that worker stopped)."""
DONE = _dbos.DONE
"""The DBOS status of a cell whose workflow completed (its run's own status is in the results)."""
CANCELLED = _dbos.CANCELLED
"""The DBOS status of a cell stopped by Stop (Resume queues it again)."""


class NoEngineTables(LookupError):
    """The database has no queue-engine tables: no experiment ever ran on the engine there."""


@dataclasses.dataclass(frozen=True)
class WorkerCells:
    """The cells one engine process runs."""

    worker: str
    """The process, as ``pid N on HOST`` only (see the module docstring)."""
    cells: int
    """Its cells running now."""
    here: bool = False
    """Whether it is this very process."""
    gone: bool = False
    """Whether it was a process of this machine that has exited (its cells wait for
    recovery, `rubric_core.engine.recovery`)."""


@dataclasses.dataclass(frozen=True)
class QueueState:
    """An experiment's cells in the queue engine, each counted under its latest attempt."""

    experiment_id: str
    """The experiment."""
    queued: int
    """Cells waiting for a worker."""
    running: tuple[WorkerCells, ...]
    """Cells running, per worker, most first."""
    done: int
    """Cells whose workflow completed."""
    cancelled: int
    """Cells stopped by Stop and not queued again."""
    failed: int
    """Cells whose workflow ended in an error of the engine (not a cell status: a bug)."""

    @property
    def running_total(self) -> int:
        """Cells running on any worker."""
        return sum(w.cells for w in self.running)

    @property
    def total(self) -> int:
        """Cells the engine has ever been given for this experiment."""
        return self.queued + self.running_total + self.done + self.cancelled + self.failed

    @property
    def active(self) -> bool:
        """Whether any cell is queued or running."""
        return bool(self.queued or self.running)


def _system_engine(store: Store) -> sa.Engine:
    """A SQLAlchemy engine on the store's engine tables; `NoEngineTables` when there are none."""
    import sqlalchemy as sa

    url = engine_database(store.connect_location())
    if url.startswith("sqlite:///"):
        if not Path(url.removeprefix("sqlite:///")).is_file():
            raise NoEngineTables
        engine = sa.create_engine(url)
        schema = None
    else:
        engine = sa.create_engine(sa.make_url(url).set(drivername="postgresql+psycopg"),
                                  pool_size=1, max_overflow=0, pool_pre_ping=True)
        schema = SYSTEM_SCHEMA
    try:
        if not sa.inspect(engine).has_table(_dbos.WORKFLOW_TABLE, schema=schema):
            raise NoEngineTables
    except BaseException:
        engine.dispose()
        raise
    return engine


@contextlib.contextmanager
def _client(store: Store) -> Iterator[Any]:
    """DBOS's client on the store's engine tables, closed afterwards (`NoEngineTables`)."""
    engine = _system_engine(store)
    try:
        with _dbos.client(engine, SYSTEM_SCHEMA) as client:
            yield client
    finally:
        engine.dispose()


def _ended_anyway(store: Store, client: Any, experiment_id: str,
                  cancelled: dict[str, str]) -> list[str]:
    """Of the cancelled workflows (id -> cell), the cells whose run has ended all the same."""
    from rubric_core.types import ENDED_STATUSES

    ended = {c.key for c in store.cell_outcomes(experiment_id) if c.status in ENDED_STATUSES}
    out = []
    for workflow in client.list_workflows(workflow_ids=list(cancelled), load_input=True,
                                          load_output=False):
        args = _dbos.args_of(workflow)
        # cell_workflow(experiment_id, row_id, config_index, repeat_index, thread_id, ...)
        if len(args) >= 4 and (args[1], args[2], args[3]) in ended:
            out.append(cancelled[workflow.workflow_id])
    return out


def queue_state(store: Store, experiment_id: str) -> QueueState:
    """The experiment's queue state as the engine's tables say now (see the module docstring).

    Args:
        store: The database (its engine tables are beside or inside it).
        experiment_id: The experiment; one never queued on the engine has every count 0.

    Raises:
        NoEngineTables: The database has no engine tables.

    """
    with _client(store) as client:
        workflows = client.list_workflows(workflow_id_prefix=id_prefix(experiment_id),
                                          load_input=False, load_output=False)
        # cell -> (attempt, status, executor, workflow id)
        latest: dict[str, tuple[int, str, str | None, str]] = {}
        for workflow in workflows:
            parsed = attempt_of(workflow.workflow_id, experiment_id)
            if parsed is not None and (parsed[0] not in latest
                                       or parsed[1] >= latest[parsed[0]][0]):
                latest[parsed[0]] = (parsed[1], workflow.status, workflow.executor_id,
                                     workflow.workflow_id)
        cancelled = {wid: cell for cell, (_, status, _, wid) in latest.items()
                     if status == CANCELLED}
        if cancelled:
            for cell in _ended_anyway(store, client, experiment_id, cancelled):
                attempt, _, executor, wid = latest[cell]
                latest[cell] = (attempt, DONE, executor, wid)
    statuses = [status for _, status, _, _ in latest.values()]
    per_worker: dict[str, list[str]] = {}
    for _, status, executor, _ in latest.values():
        if status == RUNNING:
            per_worker.setdefault(describe_owner(executor), []).append(executor or "")
    running = tuple(sorted(
        (WorkerCells(worker=shown, cells=len(executors),
                     here=any(owned_here(e) for e in executors),
                     gone=all(owner_is_gone(e) for e in executors))
         for shown, executors in per_worker.items()),
        key=lambda w: (-w.cells, w.worker)))
    return QueueState(
        experiment_id=experiment_id, queued=sum(s in QUEUED for s in statuses),
        running=running, done=statuses.count(DONE), cancelled=statuses.count(CANCELLED),
        failed=sum(s not in (*QUEUED, RUNNING, DONE, CANCELLED) for s in statuses))


def stop_cells(store: Store, experiment_id: str) -> int:
    """Stop from outside: cancel the experiment's queued and running cells; how many.

    Raises:
        NoEngineTables: The database has no engine tables.

    """
    with _client(store) as client:
        ids = [w.workflow_id for w in client.list_workflows(
            workflow_id_prefix=id_prefix(experiment_id), status=list(ACTIVE),
            load_input=False, load_output=False)]
        if ids:
            client.cancel_workflows(ids)
    return len(ids)


def regrade_executors(store: Store, job_id: str) -> list[str]:
    """The executor IDs running items of a re-grade now.

    Read as `queue_state` reads: nothing launched. Raw IDs: show them with `describe_owner`.

    Raises:
        NoEngineTables: The database has no engine tables.

    """
    with _client(store) as client:
        found = client.list_workflows(workflow_id_prefix=item_prefix(job_id), status=RUNNING,
                                      load_input=False, load_output=False)
    return sorted({w.executor_id for w in found if w.executor_id})


__all__ = ["CANCELLED", "DONE", "QUEUED", "RUNNING", "NoEngineTables", "QueueState",
           "WorkerCells", "queue_state", "regrade_executors", "stop_cells"]
