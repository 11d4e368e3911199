"""An experiment run on the queue engine, with the events of `run_experiment`.

`ExperimentDriver` (a `rubric_core.engine.driver.BatchDriver`) puts the cells that need a run
on the experiment's queue (`rubric_core.engine.queues`) and watches them end, here or on any
process with the engine launched on the same database. Its events: ``experiment_progress``
per configuration at the start and as cells end, ``cell_finished`` for the cells that end in
this process, one ``experiment_finished`` (``finished`` when every cell ended, else
``stopped``). Stop cancels the experiment's queued and running cells (running ones end after
their step, ``interrupted``); a budget's refusal (`rubric_core.experiments.budget.admit_cell`)
ends it ``stopped`` with ``budget_reached``. A lost database: the cells it cut end
``interrupted`` (`rubric_core.engine.outage`), and a session whose own reads fail on it ends
``stopped``, its ``experiment_finished`` carrying ``lost_database`` (what the store said), not
an exception. The driver ends when no cell is left to end, or
when every one of its cells' workflows has completed (an interrupted cell is left for a
Resume). Imports DBOS: `run_experiment` imports it only when it runs.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from rubric_core.engine import queues
from rubric_core.engine.body import CELL
from rubric_core.engine.driver import BatchDriver
from rubric_core.engine.holds import refused
from rubric_core.experiments.budget import BudgetGuard
from rubric_core.experiments.cell import CellBatch
from rubric_core.experiments.results import Tally, needs_run, progress_event
from rubric_core.redact import error_text
from rubric_core.store import is_unavailable
from rubric_core.types import ENDED_STATUSES, ERROR_STATUSES

if TYPE_CHECKING:
    import queue
    import threading

    from rubric_core.datasets import DatasetRow
    from rubric_core.engine.runtime import Engine
    from rubric_core.experiments.cell import CellEnding
    from rubric_core.experiments.limits import ExperimentLimits
    from rubric_core.store import ExperimentRecord, Store
    from rubric_core.types import (
        CellFinished,
        ExperimentEvent,
        ExperimentProgress,
        ModelResolver,
    )

class ExperimentDriver(BatchDriver):
    """Runs one session of an experiment (see the module docstring).

    Built on the caller's thread with `run_experiment`'s checked arguments (its limits whole:
    `ExperimentLimits`); `run` fills in what
    the database says (the rows, the cells left) on the background loop, where every later
    change happens. ``run_here``: this process runs cells too (False: only the workers of
    ``eval --workers`` do).
    """

    def __init__(self, store: Store, experiment: ExperimentRecord, models: ModelResolver,
                 stop: threading.Event, events: queue.Queue[ExperimentEvent | None],
                 limits: ExperimentLimits, retry_errors: bool,
                 guard: BudgetGuard | None = None, *, engine: Engine,
                 run_here: bool = True) -> None:
        super().__init__(store, CELL, experiment.experiment_id, stop, events, engine)
        self.experiment, self.models, self.limits = experiment, models, limits
        self.retry_errors, self.guard, self.run_here = retry_errors, guard, run_here
        self.rows: dict[str, DatasetRow] = {}
        self.tallies = [Tally() for _ in experiment.configurations]
        """Per configuration: its cells by how they ended, here or on another process."""
        self.left: dict[tuple[str, int, int], str | None] = {}
        """The cells not ended yet, with the run each had when the session started."""
        self.remaining = 0
        self.finished_here = 0
        self.workflow_ids: dict[str, tuple[str, int, int]] = {}
        """This session's cells' workflow IDs, with their keys."""
        self.lost: str | None = None
        """What the store said when the database went away during the session (its first word
        of it): a cell cut here or elsewhere, or the session's own read."""
        self.others = not run_here
        """Whether another process was seen running cells: from then on every read counts
        what ended elsewhere (a process alone never rereads a large experiment's cells)."""

    async def set_status(self, status: str) -> None:
        """Record the experiment's status."""
        await self.store.acall(self.store.set_experiment_status, self.batch_id, status)

    def caught(self, exc: BaseException) -> None:
        """A lost database is no failure to raise: the session ends ``stopped``, saying so."""
        if isinstance(exc, Exception) and is_unavailable(exc):
            self.lost = self.lost or error_text(exc)
        else:
            self.failure = exc

    def finished(self, status: str) -> dict[str, Any]:
        """``experiment_finished``, with the budget's outcome when there is one."""
        event: dict[str, Any] = {
            "type": "experiment_finished", "experiment_id": self.batch_id,
            "status": "finished" if status == "finished" else "stopped",
            "duration_s": round(time.monotonic() - self.started, 3)}
        if self.guard is not None:
            event["budget_reached"] = self.guard.reached
            event["spent_usd"] = str(self.guard.spent)
        if self.lost is not None:
            event["lost_database"] = self.lost
        return event

    def complete(self) -> bool:
        """Whether no cell is left to end."""
        return not self.left

    async def active(self) -> bool:
        """Whether a cell workflow of the experiment is queued or running."""
        return bool(await queues.active_workflows(self.batch_id))

    async def cancel(self) -> None:
        """Cancel the experiment's queued and running cells, on every process."""
        await queues.cancel_cells(self.batch_id)

    def prefixes(self) -> list[str]:
        """The workflow ID prefixes of this experiment's cells and their levels."""
        return [queues.id_prefix(self.batch_id), queues.gate_prefix(self.batch_id)]

    async def _load(self) -> None:
        """Read the dataset's rows and the cells' statuses: what is left, what is counted."""
        exp, store = self.experiment, self.store
        dataset, _ = await store.acall(store.load_dataset, exp.dataset_name, exp.dataset_version)
        self.rows = {r.id: r for r in dataset.rows}
        await store.acall(store.set_experiment_status, exp.experiment_id, "running")
        for cell in await store.acall(store.cell_outcomes, exp.experiment_id):
            self.tallies[cell.config_index].total += 1
            if needs_run(cell, self.retry_errors):
                self.left[cell.key] = cell.run_id
            else:
                self.tallies[cell.config_index].add(cell.status)
        self.remaining = len(self.left)

    async def main(self) -> str:
        """Queue the cells left, watch them end, settle the queue; the status at the end."""
        exp = self.experiment
        await self._load()
        for index in range(len(exp.configurations)):
            self.events.put(self._progress(index))
        batch = CellBatch(exp.experiment_id, experiment=exp, rows=self.rows, models=self.models,
                          on_finished=self._ended_here)
        batch.idle.set()
        try:
            if self.left:
                route = queues.routes(exp.experiment_id, exp.configurations,
                                      self.limits.model_limits(), self.limits.config_limits())
                names = await queues.register_queue(
                    exp.experiment_id, concurrency=self.limits.concurrency,
                    rate_limit=self.limits.rate, route=route)
                await self.open(batch, names, run_here=self.run_here)
                cells = await self.store.acall(self.store.experiment_cells, exp.experiment_id)
                self.workflow_ids = await queues.enqueue_cells(
                    exp.experiment_id,
                    [(c.key, c.thread_id) for c in cells if c.key in self.left],
                    retry_errors=self.retry_errors, route=route)
                await self.watch(batch)
            # The cells that ended here are counted by their own event, with their ending.
            await batch.idle.wait()
        finally:
            self.close(batch)
        # An experiment reported finished shows no cell running in its queue.
        if await self.settle():
            # Nothing queued or running: no process need poll the queue (a Resume registers it).
            with contextlib.suppress(Exception):  # another driver may have deleted it
                await queues.delete_queue(exp.experiment_id)
        if self.guard is not None:  # a cell refused on any process: the budget was reached
            self.guard.reached = await refused(queues.id_prefix(exp.experiment_id),
                                               self.workflow_ids)
            self.guard.spent = (await self.store.acall(
                BudgetGuard, self.store, exp, self.guard.budget)).spent
        if self.stop.is_set():
            return "stopped"
        outcomes = await self.store.acall(self.store.cell_outcomes, exp.experiment_id)
        left = any(c.status not in ENDED_STATUSES for c in outcomes)
        if left and self.lost is None:  # cut on another process (the workers of --workers)?
            with contextlib.suppress(Exception):
                self.lost = await queues.lost_database(self.workflow_ids)
        return "stopped" if left else "finished"

    async def count(self) -> None:
        """Count what other processes ended, once another one was seen running cells."""
        if not self.others:
            with contextlib.suppress(Exception):  # a busy database: the next round
                self.others = await queues.running_elsewhere(self.batch_id,
                                                             self.engine.executor_id)
        if self.others:
            await self._count_ended_elsewhere()

    async def settled(self) -> bool:
        """No cell queued or running: count what ended since the last count, and end."""
        await self._count_ended_elsewhere()
        return True

    def _ended_here(self, key: tuple[str, int, int], ending: CellEnding) -> None:
        """A cell of this experiment ended in this process: count it and say so."""
        status = ending.status
        if key in self.left and status in ENDED_STATUSES:
            del self.left[key]
            self.tallies[key[1]].add(status)
            self.finished_here += 1
            self.remaining -= 1
        event: CellFinished = {
            "type": "cell_finished", "experiment_id": self.batch_id, "row_id": key[0],
            "config_index": key[1], "repeat_index": key[2], "run_id": ending.run_id,
            "status": status, "error": ending.error}
        if ending.lost_database:
            event["lost_database"] = True
            self.lost = self.lost or ending.error or "the database went away"
        self.events.put(event)
        self.events.put(self._progress(key[1]))
        self.ended_here.set()

    async def _count_ended_elsewhere(self) -> None:
        """Drop from `left` the cells that ended on another process since this one started."""
        cells = await self.store.acall(self.store.cell_outcomes, self.batch_id)
        for cell in cells:
            if cell.key not in self.left or cell.status not in ENDED_STATUSES:
                continue
            if cell.status in ERROR_STATUSES and cell.run_id == self.left[cell.key]:
                continue  # the error this session was asked to retry, not a new ending
            del self.left[cell.key]
            self.tallies[cell.config_index].add(cell.status)
            self.remaining -= 1
            self.events.put(self._progress(cell.config_index))

    def _progress(self, index: int) -> ExperimentProgress:
        return progress_event(self.experiment, index, self.tallies[index], started=self.started,
                              remaining=self.remaining, finished_here=self.finished_here)


__all__ = ["ExperimentDriver"]
