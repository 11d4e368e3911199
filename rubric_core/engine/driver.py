"""An experiment run on the queue engine, with the events of `run_experiment`.

`ExperimentDriver` puts the cells that need a run on the experiment's DBOS queue
(`rubric_core.engine.queues`) and watches them end, here or on any other process with the engine
launched on the same database (``rubric-studio worker``). Its events: ``experiment_progress``
per configuration at the start and as cells end (here or elsewhere), ``cell_finished`` for the
cells that end in this process, one ``experiment_finished``; the experiment's status at the end
is ``finished`` when every cell ended, else ``stopped``.

- Limits: the experiment's concurrency is the queue's global limit, over every process; an
  optional rate limit (cells started per period) too. Per-model limits (``per_model``: cells
  at once using a model; ``model_rates``: cells using it started per period) and
  per-configuration limits (``per_config``, ``config_rates``) hold over every process as
  well: partitions of the experiment's queue, or queues of their own that a cell
  passes nested in its own workflow (`rubric_core.engine.queues.routes`, which says why and
  what each costs).
- Stop (closing the generator, or ``stop``): the experiment's queued and running workflows are
  cancelled (queued cells never start), this process's running cells stop after their step at
  once and other processes' within `rubric_core.engine.cell.CANCEL_POLL_S`, recorded
  ``interrupted``; the driver waits for its own to end.
- Budget (``guard``): each cell is admitted on the process that dequeued it, over every process
  (`rubric_core.engine.budget`); when one did not fit, the cells not started were cancelled,
  the cells in flight finish, and the experiment ends ``stopped`` with ``budget_reached`` and
  what was spent.
- Resume: running the experiment again enqueues again: cells already queued stay as they are,
  stopped ones get their next attempt (`rubric_core.engine.queues.enqueue_cells`), so nothing
  is queued twice.
- A process that died holding cells: the driver re-queues them itself every
  `rubric_core.engine.recovery.SWEEP_S` (`recover_stopped_executors`). Cells this process
  holds but does not run (orphans an outage left, `rubric_core.engine.recovery.requeue_orphans`)
  go back to their queues at the session's start and at every sweep.
- The driver ends when no cell is left to end, or when every one of its cells' workflows has
  completed (a cell whose run was interrupted, e.g. by a lost database, is then left for a
  Resume).
- A lost database: the cells it cut end ``interrupted`` (`rubric_core.engine.outage`), and a
  session whose own reads fail on it ends ``stopped``; ``experiment_finished`` then carries
  ``lost_database`` (what the store said), not an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, TypeVar

from rubric_core.engine import budget, queues
from rubric_core.engine.cell import ExperimentContext, attach, detach
from rubric_core.engine.launch import listen
from rubric_core.engine.recovery import SWEEP_S, recover_stopped_executors, requeue_orphans
from rubric_core.experiments.results import Tally, needs_run
from rubric_core.experiments.scheduler import CellKey, progress_event
from rubric_core.redact import error_text
from rubric_core.store import is_unavailable
from rubric_core.types import ENDED_STATUSES, ERROR_STATUSES

if TYPE_CHECKING:
    import queue
    import threading
    from collections.abc import Hashable, Mapping

    from rubric_core.datasets import DatasetRow
    from rubric_core.engine.launch import Engine
    from rubric_core.experiments.budget import BudgetGuard
    from rubric_core.experiments.cell import CellEnding
    from rubric_core.store import ExperimentRecord, Store
    from rubric_core.types import (
        CellFinished,
        ExperimentEvent,
        ExperimentFinished,
        ExperimentProgress,
        ModelResolver,
    )

WATCH_S = 0.5
"""How often the driver reads which cells ended (on any process)."""

_SETTLE_S = 2.0  # longest the driver waits for its cells' workflows to record their outcome
_SETTLED_EVERY = 4  # watch rounds between checks that some workflow is still queued or running


K = TypeVar("K", bound="Hashable")


def _limits(at_once: Mapping[K, int] | None, rates: Mapping[K, tuple[int, float]] | None
            ) -> dict[K, queues.ModelLimit]:
    """Cells at once and cells started per period, by what they limit, as `ModelLimit` s."""
    counts: Mapping[K, int] = at_once or {}
    periods: Mapping[K, tuple[int, float]] = rates or {}
    return {key: queues.ModelLimit(concurrency=counts.get(key), rate=periods.get(key))
            for key in {*counts, *periods}}


class ExperimentDriver:
    """Runs one session of an experiment (see the module docstring).

    Built on the caller's thread with its whole state; `run` fills in what the database says
    (the dataset's rows, the cells left) on the background loop, where every later change
    happens.
    """

    def __init__(self, store: Store, experiment: ExperimentRecord, models: ModelResolver,
                 stop: threading.Event, events: queue.Queue[ExperimentEvent | None],
                 concurrency: int, per_model: Mapping[str, int], retry_errors: bool,
                 guard: BudgetGuard | None = None, *, engine: Engine,
                 rate_limit: tuple[int, float] | None = None,
                 model_rates: Mapping[str, tuple[int, float]] | None = None,
                 per_config: Mapping[int, int] | None = None,
                 config_rates: Mapping[int, tuple[int, float]] | None = None,
                 run_here: bool = True) -> None:
        """`run_experiment`'s arguments, checked, with the engine launched in this process.

        ``run_here``: this process runs cells too (False: the workers of ``eval --workers``
        run them, `rubric_core.engine.supervisor`).
        """
        self.store, self.experiment, self.models, self.stop = store, experiment, models, stop
        self.events, self.concurrency = events, concurrency
        self.retry_errors = retry_errors
        self.guard = guard
        """What was spent and whether the budget was reached (None: no budget)."""
        self.engine = engine
        """This process's engine."""
        self.run_here = run_here
        """This process takes cells from the experiment's queue (else only queues them)."""
        self.rate_limit = rate_limit
        """At most ``(cells, seconds)`` started per period over every process, or None."""
        self.model_queues = _limits(per_model, model_rates)
        """Each limited model's limits over every process (its own queue)."""
        self.config_limits = _limits(per_config, config_rates)
        """Each limited configuration's limits (by index) over every process."""
        self.failure: BaseException | None = None
        """What ended the session with an exception, raised again on the consumer's thread."""
        self.lost: str | None = None
        """What the store said when the database went away during the session (its first
        word of it): a cell cut here or elsewhere, or the session's own read."""
        self.started = time.monotonic()
        self.rows: dict[str, DatasetRow] = {}
        """The dataset's rows by id (read when the session starts)."""
        self.tallies = [Tally() for _ in experiment.configurations]
        """Per configuration: its cells by how they ended, here or on another process."""
        self.left: dict[CellKey, str | None] = {}
        """The cells not ended yet, with the run each had when the session started (a cell
        that ended since, anywhere, is counted once, then dropped)."""
        self.remaining = 0
        """Cells not ended yet (for the ETA)."""
        self.finished_here = 0
        """Cells that ended in this process this session (for the ETA)."""
        self.ended_here = asyncio.Event()
        """Set (on the loop) when a cell of this experiment ended in this process."""
        self.workflow_ids: dict[str, tuple[str, int, int]] = {}
        """This session's cells' workflow IDs, with their keys."""
        self.others = not run_here
        """Whether another process has been seen running cells of the experiment: from then
        on every watch round rereads what ended (a process alone never rereads a large
        experiment's cells twice a second)."""

    async def run(self) -> None:
        """The whole session; it never raises (a failure is kept for the consumer's thread).

        A lost database is no failure to raise: the session ends ``stopped`` and its
        ``experiment_finished`` says so (``lost_database``), as when it cut cells.
        """
        status = "stopped"
        try:
            status = await self._main()
        except BaseException as exc:  # handed to the consumer's thread
            if isinstance(exc, Exception) and is_unavailable(exc):
                self.lost = self.lost or error_text(exc)
            else:
                self.failure = exc
        finally:
            with contextlib.suppress(Exception):
                await self.store.acall(self.store.set_experiment_status,
                                       self.experiment.experiment_id, status)
            finished: ExperimentFinished = {
                "type": "experiment_finished", "experiment_id": self.experiment.experiment_id,
                "status": "finished" if status == "finished" else "stopped",
                "duration_s": round(time.monotonic() - self.started, 3)}
            if self.guard is not None:
                finished["budget_reached"] = self.guard.reached
                finished["spent_usd"] = str(self.guard.spent)
            if self.lost is not None:
                finished["lost_database"] = self.lost
            self.events.put(finished)
            self.events.put(None)

    async def _load(self) -> None:
        """Read the dataset's rows and the cells' statuses: what is left, what is counted."""
        exp, store = self.experiment, self.store
        dataset, _ = await store.acall(store.load_dataset, exp.dataset_name, exp.dataset_version)
        self.rows = {r.id: r for r in dataset.rows}
        await store.acall(store.set_experiment_status, exp.experiment_id, "running")
        # lean: no settings decoded
        for cell in await store.acall(store.cell_outcomes, exp.experiment_id):
            self.tallies[cell.config_index].total += 1
            if needs_run(cell, self.retry_errors):
                self.left[cell.key] = cell.run_id
            else:
                self.tallies[cell.config_index].add(cell.status)
        self.remaining = len(self.left)

    async def _main(self) -> str:
        exp = self.experiment
        await self._load()
        for index in range(len(exp.configurations)):
            self.events.put(self._progress(index))
        context = ExperimentContext(
            experiment=exp, rows=self.rows, models=self.models, on_finished=self._ended_here)
        attach(context)
        try:
            if self.left:
                route = queues.routes(exp.experiment_id, exp.configurations,
                                      self.model_queues, self.config_limits)
                names = await queues.register_queue(
                    exp.experiment_id, concurrency=self.concurrency,
                    rate_limit=self.rate_limit, route=route)
                if self.run_here:
                    for name in names:
                        listen(self.engine, name)
                # This process's own cells that nothing here runs (an earlier session's, after
                # an outage) go back to their queues before the cells are queued.
                await requeue_orphans(self.store, self._prefixes(), self.engine.executor_id)
                cells = await self.store.acall(self.store.experiment_cells, exp.experiment_id)
                self.workflow_ids = await queues.enqueue_cells(
                    exp.experiment_id,
                    [(c.key, c.thread_id) for c in cells if c.key in self.left],
                    retry_errors=self.retry_errors, route=route)
                await self._watch(context)
            # The cells that ended here are counted by their own event, with their ending.
            await context.idle.wait()
        finally:
            detach(context)
        # A cell's end reaches the driver before DBOS has recorded its workflow's outcome (and
        # a cell's own workflow learns that its levels ended one result poll later): wait for
        # them, so that an experiment reported finished shows no cell running in its queue.
        deadline = time.monotonic() + _SETTLE_S
        while (time.monotonic() < deadline
               and await queues.active_workflows(exp.experiment_id)):
            await asyncio.sleep(0.05)
        if not await queues.active_workflows(exp.experiment_id):
            # Nothing queued or running (finished, or cancelled by Stop): no process need poll
            # the queue any more; a Resume registers it again.
            with contextlib.suppress(Exception):  # another driver may have deleted it
                await queues.delete_queue(exp.experiment_id)
        if self.guard is not None:  # a cell refused on any process: the budget was reached
            self.guard.reached, self.guard.spent = await budget.outcome(
                self.store, exp, self.guard.budget, self.workflow_ids)
        if self.stop.is_set():
            return "stopped"
        outcomes = await self.store.acall(self.store.cell_outcomes, exp.experiment_id)
        left = [c for c in outcomes if c.status not in ENDED_STATUSES]
        if left and self.lost is None:  # cut on another process (the workers of --workers)?
            with contextlib.suppress(Exception):
                self.lost = await queues.lost_database(self.workflow_ids)
        return "stopped" if left else "finished"

    async def _watch(self, context: ExperimentContext) -> None:
        """Count cells as they end until none is left, every workflow settled, or Stop."""
        exp_id, rounds, swept = self.experiment.experiment_id, 0, time.monotonic()
        read = 0.0
        while self.left:
            if self.stop.is_set():
                context.stopping.set()
                await queues.cancel_cells(exp_id)
                await context.idle.wait()  # this process's cells end after their step
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.ended_here.wait(), WATCH_S)
            self.ended_here.clear()
            # A cell that ended here was counted by its own event; the engine's tables (what
            # other processes did) are read once a WATCH_S, not at every cell's end: at C = 16
            # those reads were about 3 ms of this process's CPU a cell.
            if time.monotonic() - read < WATCH_S:
                continue
            read = time.monotonic()
            if not self.others:
                with contextlib.suppress(Exception):  # a busy database: the next round
                    self.others = await queues.running_elsewhere(exp_id,
                                                                 self.engine.executor_id)
            if self.others:
                await self._count_ended_elsewhere()
            rounds += 1
            if rounds % _SETTLED_EVERY == 0 and not await queues.active_workflows(exp_id):
                await self._count_ended_elsewhere()  # what ended since the last count
                return
            if time.monotonic() - swept > SWEEP_S:
                swept = time.monotonic()
                with contextlib.suppress(Exception):  # a busy database: the next sweep
                    await recover_stopped_executors(self.store, me=self.engine.executor_id)
                    await requeue_orphans(self.store, self._prefixes(),
                                          self.engine.executor_id)

    def _prefixes(self) -> list[str]:
        """The workflow ID prefixes of this experiment's cells and their levels."""
        exp_id = self.experiment.experiment_id
        return [queues.id_prefix(exp_id), queues.gate_prefix(exp_id)]

    def _ended_here(self, key: tuple[str, int, int], ending: CellEnding) -> None:
        """A cell of this experiment ended in this process: count it and say so."""
        config_index, status = key[1], ending.status
        if key in self.left and status in ENDED_STATUSES:
            del self.left[key]
            self.tallies[config_index].add(status)
            self.finished_here += 1
            self.remaining -= 1
        event: CellFinished = {
            "type": "cell_finished", "experiment_id": self.experiment.experiment_id,
            "row_id": key[0], "config_index": config_index, "repeat_index": key[2],
            "run_id": ending.run_id, "status": status, "error": ending.error}
        if ending.lost_database:
            event["lost_database"] = True
            self.lost = self.lost or ending.error or "the database went away"
        self.events.put(event)
        self.events.put(self._progress(config_index))
        self.ended_here.set()


    async def _count_ended_elsewhere(self) -> None:
        """Drop from `left` the cells that ended on another process since this one started.

        The cells are read on a thread; `left` and the tallies change on the event loop only.
        """
        cells = await self.store.acall(self.store.cell_outcomes, self.experiment.experiment_id)
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


__all__ = ["WATCH_S", "ExperimentDriver"]
