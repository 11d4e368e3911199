"""Running experiments: every cell a recorded rubric-loop run, queued on the engine.

`run_experiment` runs the cells that are not done, yielding progress events
(`rubric_core.types.ExperimentEvent`):

- Every cell is an ordinary run started or resumed by `rubric_core.session` on the cell's
  thread, with `RunSettings.dataset_row` set, so it is recorded, shown in Review and exported
  like any run. A cell's status is its run's status: nothing else is written per cell.
- Scheduling is the queue engine's (`rubric_core.engine`: DBOS Transact queues kept in the
  store's own database, or a SQLite file beside the store's): each cell that needs a run is a
  workflow with a deterministic ID on the experiment's queue, whose concurrency is the
  experiment's over every process running it; optional per-model limits and rate limits hold
  over every process too. The process that runs the experiment runs cells (``run_here``), and
  so does any ``rubric-studio worker`` on the same database (PostgreSQL). A cell's rubric loop
  runs on the one background loop (`rubric_core.background.work_loop`: LangGraph's
  ``astream``, async model calls), so a hundred cells in flight are a hundred coroutines, not
  threads. Chat models are built once per experiment and the compiled agent is shared by a
  configuration's cells (`experiment_models`, `rubric_core.runner.build_agent`).
- A 429 or 5xx from an OpenAI-compatible server does not fail the row: the HTTP clients the
  default models use (`experiment_models`) wait and retry it, and the wait is shared
  (`SharedBackoff`), so the whole experiment slows down instead of hammering the server.
- Stop (closing the generator, or setting ``stop``) cancels the experiment's queued and
  running workflows: running cells end after their step, ``interrupted``. A closed tab or a
  killed process leaves cells stale ``running``; their workflows are recovered
  (`rubric_core.engine.recovery`) and running the experiment again continues the rest on
  their own threads (`rubric_core.session.aresume`). A cell whose run ended is never run
  again; one that ended ``error`` or ``grader_error`` runs again only when asked
  (`retry_errors`, or `rubric_core.experiments.create.retry_cell` for one cell).
- A budget (`rubric_core.experiments.budget`, enforced by its `admit_cell`): a cell
  starts only when what was spent plus the estimates of the cells in flight on every process
  and its own stay within it; otherwise the cells not started are cancelled, the cells in
  flight finish and the experiment ends ``stopped`` with ``budget_reached`` set, resumable
  like a Stop. The budget is kept with the experiment, so a Resume continues under it.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING

from rubric_core.background import drive
from rubric_core.experiments.budget import Budget, BudgetGuard
from rubric_core.experiments.cell import experiment_models
from rubric_core.experiments.create import require_experiment
from rubric_core.experiments.limits import ExperimentLimits
from rubric_core.experiments.results import progress_event
from rubric_core.http_retry import SharedBackoff
from rubric_core.types import DEFAULT_CONCURRENCY

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from rubric_core.settings import ExperimentConfig
    from rubric_core.store import Store
    from rubric_core.types import ExperimentEvent, ModelResolver

CellKey = tuple[str, int, int]
"""A cell: ``(row id, configuration index, repeat index)``."""


def check_limits(concurrency: int, per_model: Mapping[str, int] | None = None) -> None:
    """Refuse an experiment's concurrency or a per-model limit out of 1 … `MAX_CONCURRENCY`.

    `ExperimentLimits`'s own check, for a caller that has no whole limits yet.

    Raises:
        ValueError: The first limit out of range, named with its value.

    """
    ExperimentLimits(concurrency=concurrency, per_model=dict(per_model or {}))


def run_experiment(
    store: Store,
    experiment_id: str,
    *,
    limits: ExperimentLimits | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    per_model: Mapping[str, int] | None = None,
    models: ModelResolver | None = None,
    backoff: SharedBackoff | None = None,
    retry_errors: bool = False,
    stop: threading.Event | None = None,
    budget: Budget | None = None,
    rate_limit: tuple[int, float] | None = None,
    model_rates: Mapping[str, tuple[int, float]] | None = None,
    per_config: Mapping[int, int] | None = None,
    config_rates: Mapping[int, tuple[int, float]] | None = None,
    run_here: bool = True,
) -> Iterator[ExperimentEvent]:
    """Run (or continue) an experiment's cells, yielding progress as cells end.

    Closing the iterator early is Stop: running cells are closed (their runs become
    ``interrupted``) and the experiment ``stopped``; calling this again continues it.

    Args:
        store: The database.
        experiment_id: The experiment.
        limits: Every limit at once (`ExperimentLimits`, as the CLI and the app pass them);
            when given, ``concurrency``, ``per_model``, ``rate_limit``, ``model_rates``,
            ``per_config`` and ``config_rates`` are not read.
        concurrency: Cells run at once (1 to `MAX_CONCURRENCY`).
        per_model: At most this many cells at once using a model (worker or grader), by model
            string, over every process running the experiment.
        models: Builds the chat models (`experiment_models(backoff)` when omitted; a custom
            resolver gets the shared backoff only if it uses ``backoff.http_client()``).
        backoff: The shared backoff (a new `SharedBackoff` when omitted).
        retry_errors: Also run again the cells that ended ``error`` (continuing their
            threads) or ``grader_error`` (on a fresh thread).
        stop: Set it (from any thread) to stop, like closing the iterator.
        budget: Start no cell that would spend past it (`rubric_core.experiments.budget`);
            kept with the experiment for later Resumes. Without: the budget kept with it, if
            any.
        rate_limit: At most ``(limit, period_s)`` cells started per period, over every
            process.
        model_rates: Per model string, at most ``(limit, period_s)`` cells using that model
            (worker or grader) started per period, over every process. Every model named must
            be one a configuration of the experiment uses.
        per_config: Per configuration (its index in the experiment), at most this many of its
            cells at once, over every process.
        config_rates: Per configuration (its index), at most ``(limit, period_s)`` of its
            cells started per period, over every process. With the model limits: a cell
            starts when every limit it meets lets it (`rubric_core.engine.queues.routes`).
        run_here: This process runs cells too; False: it only queues the cells and watches
            them end, on the workers (``eval --workers N``, ``rubric-studio worker``).

    Yields:
        ``experiment_progress`` for every configuration at the start and after each cell,
        ``cell_finished``, ``experiment_backoff``, and one ``experiment_finished`` at the end.

    Raises:
        KeyError: No such experiment.
        ValueError: A bad concurrency, per-model or per-configuration limit or rate limit,
            a rate limit for a model no configuration uses, or a limit for a configuration the
            experiment does not have.
        BudgetError: A budget that cannot be enforced (a model of unknown price).

    """
    experiment = require_experiment(store, experiment_id)
    if limits is None:
        limits = ExperimentLimits(
            concurrency=concurrency, rate=rate_limit, per_model=dict(per_model or {}),
            model_rates=dict(model_rates or {}), per_config=dict(per_config or {}),
            config_rates=dict(config_rates or {}))
    limits.check(experiment.configurations)
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

    from rubric_core.engine.launch import engine_for  # imports DBOS: only when run
    from rubric_core.experiments.driver import ExperimentDriver

    with engine_for(store) as engine:
        driver = ExperimentDriver(store, experiment, models, stop, events, limits,
                                  retry_errors, guard, engine=engine, run_here=run_here)
        yield from drive(driver, events, stop, backoff, "experiment_backoff")


def check_rates(rate_limit: tuple[int, float] | None, *,
                model_rates: Mapping[str, tuple[int, float]] | None = None,
                configs: Sequence[ExperimentConfig] = ()) -> None:
    """Refuse a bad rate limit, or one for a model no configuration uses (`ExperimentLimits`).

    Raises:
        ValueError: Naming the problem.

    """
    ExperimentLimits(rate=rate_limit, model_rates=dict(model_rates or {})).check(configs)


def check_config_limits(configs: Sequence[ExperimentConfig],
                        per_config: Mapping[int, int] | None = None,
                        config_rates: Mapping[int, tuple[int, float]] | None = None) -> None:
    """Refuse a per-configuration limit or rate limit the experiment cannot apply.

    Raises:
        ValueError: An index the experiment has no configuration for, or a bad limit.

    """
    ExperimentLimits(per_config=dict(per_config or {}),
                     config_rates=dict(config_rates or {})).check(configs)


__all__ = ["CellKey", "check_config_limits", "check_limits", "check_rates", "experiment_models",
           "progress_event", "run_experiment"]
