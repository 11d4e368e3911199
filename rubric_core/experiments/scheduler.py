"""Running experiments: every cell a recorded rubric-loop run, as coroutines on one event loop.

`run_experiment` runs the cells that are not done, yielding progress events
(`rubric_core.types.ExperimentEvent`):

- Every cell is an ordinary run started or resumed by `rubric_core.session` on the cell's
  thread, with `RunSettings.dataset_row` set, so it is recorded, shown in Review and exported
  like any run. A cell's status is its run's status: nothing else is written per cell.
- Concurrency: ``concurrency`` slots on one asyncio event loop (one per process, shared by
  the experiments it runs); each claims a cell, runs it and claims the next (a slot holding a
  cell waits for ``per_model[m]`` when the cell uses model ``m``). A cell's rubric loop runs
  on that loop too (`rubric_core.session.astart`: LangGraph's ``astream``, async model
  calls), so a hundred cells in flight are a hundred coroutines, not threads: no thread switch
  per graph step, which at high concurrency cost more CPU than the steps. The database is
  written through `Store.acall` (on the loop for SQLite, from worker threads for PostgreSQL).
  Stop or a lost lease ends a cell's run after the step in progress. Chat models are
  built once per experiment and the compiled agent is shared by a configuration's cells
  (`experiment_models`, `rubric_core.runner.build_agent`).
- Several workers: a cell is run under a lease in the database (`Store.claim_cell`: ``FOR
  UPDATE SKIP LOCKED`` on PostgreSQL, the write lock on SQLite), renewed every
  `rubric_core.session.HEARTBEAT_S` seconds and expiring after `~session.STALE_AFTER_S`. So
  several processes, on one machine or many, can run the same experiment at once: none runs
  a cell another holds, and the cells of a worker that died are claimed by the others once
  its leases expire (its runs continue on their own threads). The leases are one section of
  `ExperimentDriver` (claim, renew, count what others ended), the part a queue engine will replace.
- A 429 or 5xx from an OpenAI-compatible server does not fail the row: the HTTP clients the
  default models use (`experiment_models`) wait and retry it, and the wait is shared
  (`SharedBackoff`), so the whole experiment slows down instead of hammering the server.
- Stop (closing the generator, or setting ``stop``), a closed tab or a killed process leave
  cells ``interrupted`` or stale ``running``; running the experiment again continues them on
  their own threads (`rubric_core.session.aresume`). A cell whose run ended is never run again;
  one that ended ``error`` or ``grader_error`` runs again only when asked (`retry_errors`, or
  `rubric_core.experiments.create.retry_cell` for one cell).
- A budget (`rubric_core.experiments.budget`): before a claimed cell starts, `BudgetGuard`
  checks that what was spent plus the estimates of the cells in flight and of this one stay
  within it (a query per cell that ends, never one over every cell); when not, the cell is
  released unstarted, no further cell starts, the cells in flight finish and the experiment
  ends ``stopped`` with ``budget_reached`` set, resumable like a Stop. The budget is kept with
  the experiment, so a Resume (and every worker process) continues under it. Each worker
  process holds back only its own cells in flight; the queue engine holds back every
  process's (`rubric_core.engine.budget`).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from typing import TYPE_CHECKING

from rubric_core import session
from rubric_core.background import drive
from rubric_core.consensus import REPEATS_IN_SEQUENCE
from rubric_core.experiments.budget import Budget, BudgetGuard
from rubric_core.experiments.cell import cell_settings, run_cell
from rubric_core.experiments.create import require_experiment
from rubric_core.experiments.results import Tally, needs_run
from rubric_core.http_retry import SharedBackoff
from rubric_core.models import model_resolver
from rubric_core.registry import new_owner
from rubric_core.store import StoreError
from rubric_core.types import (
    DEFAULT_CONCURRENCY,
    ENDED_STATUSES,
    ENGINES,
    ERROR_STATUSES,
    MAX_CONCURRENCY,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from rubric_core.datasets import DatasetRow
    from rubric_core.settings import ExperimentConfig, RunSettings
    from rubric_core.store import CellRecord, ExperimentRecord, Store
    from rubric_core.types import (
        ExperimentEvent,
        ExperimentFinished,
        ExperimentProgress,
        ModelResolver,
    )

CellKey = tuple[str, int, int]
"""A cell: ``(row id, configuration index, repeat index)``."""

_CLAIM_POLL_S = 1.0  # how often a worker whose remaining cells are all leased looks again
_WATCH_S = 2.0  # how often a worker counts the cells other workers ended


def experiment_models(
    backoff: SharedBackoff, *, api_key: str | None = None, env_keys: bool = True
) -> ModelResolver:
    """Models for an experiment, as `rubric_core.models.model_resolver` builds them for one.

    OpenAI and OpenAI-compatible models (also inside ``hybrid:``) send through both HTTP
    clients of ``backoff`` (sync and async), which retry 429/5xx through the shared wait;
    nothing streams (nobody watches a cell's tokens); and each model string and endpoint gets
    one model for the whole experiment, so every cell of a configuration reuses one compiled
    agent. The app's experiments get the same through
    `rubric_core.app_support.app_models` (with its key rule).

    Args:
        backoff: The experiment's shared backoff.
        api_key: A key for the models' endpoint (never stored); the environment's otherwise.
        env_keys: Whether a base URL may receive ``OPENAI_API_KEY`` from the environment.

    """
    return model_resolver(api_key=api_key, env_keys=env_keys, backoff=backoff, share=True,
                          streaming=False)


def check_limits(concurrency: int, per_model: Mapping[str, int] | None = None) -> None:
    """Refuse an experiment's concurrency or a per-model limit out of 1 … `MAX_CONCURRENCY`.

    `run_experiment` checks them; so does whoever splits them between processes before
    anything runs (`rubric_core.workers.WorkerPlan`).

    Raises:
        ValueError: The first limit out of range, named with its value.

    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not (
            1 <= concurrency <= MAX_CONCURRENCY):
        msg = f"concurrency must be from 1 to {MAX_CONCURRENCY}, got {concurrency}"
        raise ValueError(msg)
    for model, limit in (per_model or {}).items():
        if isinstance(limit, bool) or not isinstance(limit, int) or not (
                1 <= limit <= MAX_CONCURRENCY):
            msg = f"model limit {model}={limit} must be from 1 to {MAX_CONCURRENCY}"
            raise ValueError(msg)


def run_experiment(
    store: Store,
    experiment_id: str,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    per_model: Mapping[str, int] | None = None,
    models: ModelResolver | None = None,
    backoff: SharedBackoff | None = None,
    retry_errors: bool = False,
    stop: threading.Event | None = None,
    budget: Budget | None = None,
    engine: str = "lease",
    rate_limit: tuple[int, float] | None = None,
    model_rates: Mapping[str, tuple[int, float]] | None = None,
    run_here: bool = True,
) -> Iterator[ExperimentEvent]:
    """Run (or continue) an experiment's cells, yielding progress as cells end.

    Closing the iterator early is Stop: running cells are closed (their runs become
    ``interrupted``) and the experiment ``stopped``; calling this again continues it.

    Args:
        store: The database.
        experiment_id: The experiment.
        concurrency: Cells run at once (1 to `MAX_CONCURRENCY`).
        per_model: At most this many cells at once using a model (worker or grader), by model
            string (with ``engine="dbos"``: over every process running the experiment).
        models: Builds the chat models (`experiment_models(backoff)` when omitted; a custom
            resolver gets the shared backoff only if it uses ``backoff.http_client()``).
        backoff: The shared backoff (a new `SharedBackoff` when omitted).
        retry_errors: Also run again the cells that ended ``error`` (continuing their
            threads) or ``grader_error`` (on a fresh thread).
        stop: Set it (from any thread) to stop, like closing the iterator.
        budget: Start no cell that would spend past it (`rubric_core.experiments.budget`);
            kept with the experiment for later Resumes. Without: the budget kept with it, if
            any.
        engine: ``lease`` (the lease queue, this module) or ``dbos`` (the queue engine,
            `rubric_core.engine`, a preview: ``concurrency`` is then a limit over every process
            running the experiment, and so is a budget: `rubric_core.engine.budget`).
        rate_limit: With ``engine="dbos"``: at most ``(limit, period_s)`` cells started per
            period, over every process.
        model_rates: With ``engine="dbos"``: per model string, at most ``(limit, period_s)``
            cells using that model (worker or grader) started per period, over every process.
            Every model named must be one a configuration of the experiment uses.
        run_here: With ``engine="dbos"``: this process runs cells too; False: it only queues
            the cells and watches them end, on the workers (``eval --workers N``).

    Yields:
        ``experiment_progress`` for every configuration at the start and after each cell,
        ``cell_finished``, ``experiment_backoff``, and one ``experiment_finished`` at the end.

    Raises:
        KeyError: No such experiment.
        ValueError: A bad concurrency, per-model limit, engine or rate limit, or a rate limit
            for a model no configuration uses.
        BudgetError: A budget that cannot be enforced (a model of unknown price).

    """
    experiment = require_experiment(store, experiment_id)
    check_limits(concurrency, per_model)
    check_engine(engine, rate_limit, model_rates=model_rates,
                 configs=experiment.configurations)
    guard = None
    if budget is None and experiment.budget is not None:
        budget = Budget.from_dict(experiment.budget)
    if budget is not None:
        guard = BudgetGuard(store, experiment, budget)  # refuses unknown prices first
        store.set_experiment_budget(experiment_id, budget.to_dict())
    backoff = backoff or SharedBackoff()
    models = models or experiment_models(backoff)
    stop = stop or threading.Event()
    events: queue.Queue[ExperimentEvent | None] = queue.Queue()

    if engine == "dbos":
        from rubric_core.engine import EngineDriver, launch_engine

        engine_driver = EngineDriver(store, experiment, models, stop, events, concurrency,
                                     per_model or {}, retry_errors, guard,
                                     engine=launch_engine(store, every_queue=False),
                                     rate_limit=rate_limit, model_rates=model_rates,
                                     run_here=run_here)
        yield from drive(engine_driver, events, stop, backoff, "experiment_backoff")
        return
    driver = ExperimentDriver(store, experiment, models, stop, events, concurrency,
                              per_model or {}, retry_errors, guard)
    yield from drive(driver, events, stop, backoff, "experiment_backoff")


def _check_rate(rate: tuple[int, float], what: str) -> None:
    limit, period = rate
    if (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
            or not isinstance(period, int | float) or not period > 0):
        msg = (f"{what} is a whole number of cells (at least 1) per a positive number "
               f"of seconds, got {limit!r} per {period!r}")
        raise ValueError(msg)


def check_engine(engine: str, rate_limit: tuple[int, float] | None, *,
                 model_rates: Mapping[str, tuple[int, float]] | None = None,
                 configs: Sequence[ExperimentConfig] = ()) -> None:
    """Refuse an unknown engine or a bad rate limit (a rate limit needs the queue engine).

    Args:
        engine: ``lease`` or ``dbos``.
        rate_limit: The whole experiment's rate limit, or None.
        model_rates: Per-model rate limits, each for a model one of ``configs`` uses.
        configs: The experiment's configurations.

    Raises:
        ValueError: Naming the problem.

    """
    if engine not in ENGINES:
        msg = f"engine must be one of {', '.join(ENGINES)}, got {engine!r}"
        raise ValueError(msg)
    if (rate_limit is not None or model_rates) and engine != "dbos":
        msg = "a rate limit needs the queue engine (engine='dbos')"
        raise ValueError(msg)
    if rate_limit is not None:
        _check_rate(rate_limit, "a rate limit")
    used = {m for c in configs for m in (c.worker_model, c.grader_model)}
    for model, rate in (model_rates or {}).items():
        if model not in used:
            msg = (f"a rate limit for model {model!r}, which no configuration of the experiment "
                   f"uses (its models: {', '.join(sorted(used))})")
            raise ValueError(msg)
        _check_rate(rate, f"the rate limit of {model}")


class ExperimentDriver:
    """Runs one session of an experiment as a coroutine on the experiments' loop.

    Built on the caller's thread with its whole state; `run` fills in what the database says
    (the dataset's rows, the cells left) on the loop, where every later change happens.
    """

    def __init__(self, store: Store, experiment: ExperimentRecord, models: ModelResolver,
                 stop: threading.Event, events: queue.Queue[ExperimentEvent | None],
                 concurrency: int, per_model: Mapping[str, int], retry_errors: bool,
                 guard: BudgetGuard | None = None) -> None:
        self.store, self.experiment, self.models, self.stop = store, experiment, models, stop
        self.guard = guard
        """The budget's check before each cell (None: no budget)."""
        self.events, self.concurrency = events, concurrency
        self.retry_errors = retry_errors
        self.model_limits = {m: asyncio.Semaphore(n) for m, n in per_model.items()}
        """Per model string: the cells that may use it at once (`run_experiment`'s
        ``per_model``)."""
        self.owner = new_owner()
        """This worker's name on the leases it holds."""
        self.failure: BaseException | None = None
        """What ended the session with an exception, raised again on the consumer's thread."""
        self.started = time.monotonic()
        self.rows: dict[str, DatasetRow] = {}
        """The dataset's rows by id (read when the session starts)."""
        self.tallies = [Tally() for _ in experiment.configurations]
        """Per configuration: its cells by how they ended, here or on another worker."""
        self.left: dict[CellKey, str | None] = {}
        """The cells this worker may still claim, with the run each had when the session
        started (a cell another worker ended since is counted, not run again)."""
        self.remaining = 0
        """Cells not ended yet (for the ETA)."""
        self.finished_here = 0
        """Cells this session ended (for the ETA)."""
        self.held: dict[CellKey, threading.Event] = {}
        """The cells whose lease this worker holds, each with the event its loss sets."""

    async def run(self) -> None:
        """The whole session; it never raises (a failure is kept for the consumer's thread)."""
        status = "stopped"
        try:
            status = await self._main()
        except BaseException as exc:  # handed to the consumer's thread
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
        slots = min(self.concurrency, len(self.left))
        helpers = [asyncio.create_task(self._renew_leases()),
                   asyncio.create_task(self._watch_elsewhere())]
        try:
            await asyncio.gather(*(self._slot() for _ in range(slots)))
        finally:
            for task in helpers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.stop.is_set():
            return "stopped"
        outcomes = await self.store.acall(self.store.cell_outcomes, exp.experiment_id)
        left = [c for c in outcomes if c.status not in ENDED_STATUSES]
        return "stopped" if left else "finished"

    # -- leases: several workers (processes, machines) share one experiment's cells --------------
    # (`_claim`, `_slot`'s release, `_renew_leases`, `_watch_elsewhere`, `_count_ended_elsewhere`:
    # what a queue engine's workflows and recovery will replace)

    def _claim(self) -> CellRecord | None:
        done = ENDED_STATUSES - ERROR_STATUSES if self.retry_errors else ENDED_STATUSES
        return self.store.claim_cell(self.experiment.experiment_id, self.owner,
                                     lease_s=session.STALE_AFTER_S, done=done,
                                     keys=list(self.left))

    async def _count_ended_elsewhere(self) -> None:
        """Drop from `left` the cells another worker ended since this one started.

        The cells are read on a thread; `left` and the tallies change on the event loop only.
        """
        cells = await self.store.acall(self.store.cell_outcomes, self.experiment.experiment_id)
        for cell in cells:
            if cell.key not in self.left or cell.status not in ENDED_STATUSES:
                continue
            if cell.status in ERROR_STATUSES and cell.run_id == self.left[cell.key]:
                continue  # the error this worker was asked to retry, not a new ending
            del self.left[cell.key]
            self.tallies[cell.config_index].add(cell.status)
            self.remaining -= 1
            self.events.put(self._progress(cell.config_index))

    async def _slot(self) -> None:
        """Claim a cell, run it, release it; until none is left or Stop."""
        exp_id = self.experiment.experiment_id
        # A slot is one request in flight: grader repeats wait for each other (this task only).
        REPEATS_IN_SEQUENCE.set(True)
        while not self.stop.is_set() and self.left and not self._over_budget():
            cell = await self.store.acall(self._claim)
            if cell is None:  # the rest are leased by other workers: wait for them or their expiry
                await self._count_ended_elsewhere()
                if self.left:
                    await asyncio.sleep(_CLAIM_POLL_S)
                continue
            if self.guard is not None and not self.guard.admit(cell.key):
                with contextlib.suppress(StoreError):  # unstarted: left for a Resume
                    await self.store.acall(self.store.release_cell, exp_id, cell.key,
                                            self.owner)
                break
            self.left.pop(cell.key, None)
            lost = self.held[cell.key] = threading.Event()
            try:
                await self._cell(cell, self.rows[cell.row_id], lost)
            finally:
                del self.held[cell.key]
                with contextlib.suppress(StoreError):
                    await self.store.acall(self.store.release_cell, exp_id, cell.key,
                                            self.owner)

    def _over_budget(self) -> bool:
        return self.guard is not None and self.guard.reached

    async def _watch_elsewhere(self) -> None:
        """Count, as they end, the cells other workers run, so progress covers theirs too.

        The cells are read only once another worker has been seen holding one (a cheap count):
        a worker alone does not reread a large experiment every few seconds.
        """
        exp_id, others = self.experiment.experiment_id, False
        while True:
            await asyncio.sleep(_WATCH_S)
            with contextlib.suppress(StoreError):  # a busy database: the next round retries
                others = others or bool(await self.store.acall(
                    self.store.leased_elsewhere, exp_id, self.owner))
                if others:
                    await self._count_ended_elsewhere()

    async def _renew_leases(self) -> None:
        """Keep this worker's leases alive; a lease found lost stops work on its cell."""
        exp_id = self.experiment.experiment_id
        while True:
            await asyncio.sleep(min(session.HEARTBEAT_S, session.STALE_AFTER_S / 3))
            for key, lost in list(self.held.items()):
                with contextlib.suppress(StoreError):  # a busy database: the next round retries
                    if not await self.store.acall(self.store.renew_lease, exp_id, key,
                                                   self.owner, lease_s=session.STALE_AFTER_S):
                        lost.set()

    async def _cell(self, cell: CellRecord, row: DatasetRow, lost: threading.Event) -> None:
        config = self.experiment.configurations[cell.config_index]
        names = sorted({config.worker_model, config.grader_model} & self.model_limits.keys())
        async with contextlib.AsyncExitStack() as stack:
            for name in names:  # always in the same order, so no two cells deadlock
                await stack.enter_async_context(self.model_limits[name])
            if self.stop.is_set():
                if self.guard is not None:
                    self.guard.release(cell.key)
                return
            try:
                status, run_id, error = await self._run_cell(cell, self._settings(cell, row),
                                                             lost)
            except BaseException:
                if self.guard is not None:
                    self.guard.release(cell.key)
                raise
        if self.guard is not None:
            calls = [] if run_id is None else (
                await self.store.acall(self.store.call_usage_for_runs, [run_id]))[run_id]
            self.guard.ended_cell(cell.key, run_id, calls, status in ENDED_STATUSES)
        if status in ENDED_STATUSES:
            self.tallies[cell.config_index].add(status)
            self.finished_here += 1
            self.remaining -= 1
        self.events.put({"type": "cell_finished", "experiment_id": cell.experiment_id,
                         "row_id": cell.row_id, "config_index": cell.config_index,
                         "repeat_index": cell.repeat_index, "run_id": run_id,
                         "status": status, "error": error})
        self.events.put(self._progress(cell.config_index))

    def _settings(self, cell: CellRecord, row: DatasetRow) -> RunSettings:
        return cell_settings(self.experiment, row, cell.key)

    async def _run_cell(self, cell: CellRecord, settings: RunSettings, lost: threading.Event
                        ) -> tuple[str, str | None, str | None]:
        """One cell (`rubric_core.experiments.cell.run_cell`); (status, run, error).

        Stop or a lost lease ends the run after the step in progress (never halfway through
        one), recorded ``interrupted``; the next Resume continues its thread from there.
        """
        def stopping() -> bool:
            return self.stop.is_set() or lost.is_set()

        return await run_cell(self.store, experiment_id=cell.experiment_id, key=cell.key,
                              thread_id=cell.thread_id, settings=settings, models=self.models,
                              retry_errors=self.retry_errors, stop=stopping)

    def _progress(self, index: int) -> ExperimentProgress:
        return progress_event(self.experiment, index, self.tallies[index], started=self.started,
                              remaining=self.remaining, finished_here=self.finished_here)


def progress_event(experiment: ExperimentRecord, index: int, tally: Tally, *, started: float,
                   remaining: int, finished_here: int) -> ExperimentProgress:
    """A configuration's ``experiment_progress`` event, with an ETA from this session's pace.

    Args:
        experiment: The experiment.
        index: The configuration.
        tally: Its cells by how they ended.
        started: When this session started (``time.monotonic()``).
        remaining: Cells not ended yet, over all configurations.
        finished_here: Cells this session ended.

    """
    elapsed = time.monotonic() - started
    eta = round(remaining * elapsed / finished_here, 1) if finished_here else None
    return {"type": "experiment_progress", "experiment_id": experiment.experiment_id,
            "config_index": index, "label": experiment.configurations[index].display_label(),
            "done": tally.done, "total": tally.total, "satisfied": tally.satisfied,
            "errors": tally.errors,
            "satisfied_rate": round(tally.satisfied / tally.done, 4) if tally.done else None,
            "eta_s": eta}


__all__ = ["CellKey", "ExperimentDriver", "check_engine", "check_limits", "experiment_models",
           "progress_event", "run_experiment"]
