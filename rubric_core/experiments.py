"""Experiments: one dataset × configurations × repeats, each cell a recorded rubric-loop run.

`create_experiment` stores the dataset (when given one) and the experiment with all its cells;
each cell gets its own LangGraph thread up front. `run_experiment` runs the cells that are not
done, yielding progress events (`rubric_core.types.ExperimentEvent`):

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
  its leases expire (its runs continue on their own threads).
- A 429 or 5xx from an OpenAI-compatible server does not fail the row: the HTTP client the
  default models use (`experiment_models`) waits and retries it, and the wait is shared
  (`SharedBackoff`), so the whole experiment slows down instead of hammering the server.
- Stop (closing the generator, or setting ``stop``), a closed tab or a killed process leave
  cells ``interrupted`` or stale ``running``; running the experiment again continues them on
  their own threads (`rubric_core.session.aresume`). A cell whose run ended is never run again;
  one that ended ``error`` or ``grader_error`` runs again only when asked (`retry_errors`, or
  `retry_cell` for one cell).

Results (`experiment_results`) read every cell's run totals and last grading run back in one
query (`Store.cell_outcomes`); the streamed export (`export_experiment_rows`) reads cells, runs
and evaluations a page at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import queue
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core import session
from rubric_core.analytics import Comparison, compare_outcomes
from rubric_core.export import EXPORT_COLUMNS, export_rows
from rubric_core.http_retry import RETRY_STATUS_CODES, SharedBackoff
from rubric_core.models import resolve_model
from rubric_core.redact import error_text, redact
from rubric_core.rubric import normalize_name
from rubric_core.store import StoreError
from rubric_core.types import TERMINAL_STATUSES

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from langchain_core.language_models import BaseChatModel

    from rubric_core.datasets import Dataset, DatasetRow
    from rubric_core.settings import ExperimentConfig, RunSettings
    from rubric_core.store import CellOutcome, CellRecord, ExperimentRecord, PassVerdicts, Store
    from rubric_core.types import (
        ExperimentEvent,
        ExperimentFinished,
        ExperimentProgress,
    )

DEFAULT_CONCURRENCY = 4
"""Cells run at once unless the caller says otherwise."""

MAX_CONCURRENCY = 64
"""Most cells at once: each running cell holds an HTTP connection and a database row."""

MAX_REPEATS = 20
"""Most runs of one row under one configuration."""

MAX_CELLS = 100_000
"""Most cells (rows × configurations × repeats) in one experiment."""


ERROR_STATUSES = frozenset({"error", "grader_error"})
"""Cell statuses that are recorded as ended but can be retried alone."""

ENDED_STATUSES = TERMINAL_STATUSES | {"error"}
"""Cell statuses that count as done: a cell in one of them is not run again by itself."""

SUMMARY_COLUMNS: tuple[str, ...] = (
    "config_index", "configuration", "worker_model", "grader_model", "cells", "done",
    "satisfied_pct", "first_pass_satisfied_pct", "mean_passes", "errors", "input_tokens",
    "output_tokens", "mean_duration_s",
)
"""Columns of `ExperimentResults.summary`, in order."""

CRITERIA_COLUMNS: tuple[str, ...] = (
    "config_index", "criterion", "cells", "first_pass_rate", "final_pass_rate",
    "mean_passes_to_fix",
)
"""Columns of `ExperimentResults.criteria`, in order."""

_CELL_COLUMNS = ("experiment_id", "configuration", "config_index", "repeat_index")
_STALE_POLL_S = 1.0
_CLAIM_POLL_S = 1.0  # how often a worker whose remaining cells are all leased looks again
_WATCH_S = 2.0  # how often a worker counts the cells other workers ended
_RUNS_PER_READ = 100


def _uses_openai_client(model: str) -> bool:
    provider = model.removeprefix("hybrid:").partition(":")[0]
    return provider == "openai-compatible" or provider == "openai"


def experiment_models(
    backoff: SharedBackoff, *, api_key: str | None = None, env_keys: bool = True
) -> session.ModelResolver:
    """Models for an experiment: `rubric_core.models.resolve_model`, through ``backoff``.

    OpenAI and OpenAI-compatible models (also inside ``hybrid:``) get an HTTP client that
    retries 429/5xx through the shared backoff; other models are built as for one run.

    Args:
        backoff: The experiment's shared backoff.
        api_key: A key for the models' endpoint (never stored); the environment's otherwise.
        env_keys: Whether a base URL may receive ``OPENAI_API_KEY`` from the environment.

    """
    built: dict[tuple[str, str | None], BaseChatModel] = {}
    lock = threading.Lock()

    def resolve(model: str, role: session.Role, base_url: str | None) -> BaseChatModel:
        del role  # every role gets the same client
        # One instance per model and endpoint for the whole experiment (chat models are safe to
        # share between threads), so every cell of a configuration reuses one compiled agent
        # (`rubric_core.runner.build_agent` keeps them by their models' identity).
        with lock:
            if (model, base_url) not in built:
                # Nobody watches a cell's tokens: one response per call costs a fraction of the
                # CPU of a stream of chunks, and under the GIL CPU limits concurrent cells.
                extra: dict[str, Any] = {"disable_streaming": True}
                if _uses_openai_client(model):
                    extra["http_client"] = backoff.http_client()
                    extra["http_async_client"] = backoff.http_async_client()
                built[model, base_url] = resolve_model(
                    model, base_url=base_url, api_key=api_key, env_keys=env_keys, **extra)
            return built[model, base_url]

    return resolve


# -- creating -------------------------------------------------------------------------------------


def _require_experiment(store: Store, experiment_id: str) -> ExperimentRecord:
    """The experiment, or a KeyError naming the id and the database."""
    experiment = store.get_experiment(experiment_id)
    if experiment is None:
        msg = f"no experiment with id {experiment_id!r} in {store.path}"
        raise KeyError(msg)
    return experiment


def _experiment_and_dataset(store: Store, experiment_id: str) -> tuple[ExperimentRecord, Dataset]:
    """The experiment and the dataset version it runs over."""
    experiment = _require_experiment(store, experiment_id)
    dataset, _ = store.load_dataset(experiment.dataset_name, experiment.dataset_version)
    return experiment, dataset


def create_experiment(
    store: Store,
    dataset: Dataset | str,
    configurations: Sequence[ExperimentConfig],
    *,
    repeats: int = 1,
    name: str = "",
    dataset_version: int | None = None,
    models: session.ModelResolver | None = None,
) -> ExperimentRecord:
    """Check and store an experiment with all its cells; nothing runs yet.

    Args:
        store: The database.
        dataset: A parsed dataset (stored as a new version unless unchanged) or a stored
            dataset's name.
        configurations: One or more configurations.
        repeats: Runs of every row under every configuration (1 to `MAX_REPEATS`).
        name: A label (the dataset's name when empty).
        dataset_version: With a stored name: that version (the latest when None).
        models: Builds the chat models to check them (`session.default_models()` if omitted).

    Raises:
        ValueError: No configurations, a row that cannot run under a configuration (the
            message names the row), a bad repeat count, more than `MAX_CELLS` cells. Nothing
            is stored.
        KeyError: No such stored dataset.
        ModelConfigError: A configuration's model cannot be built. Nothing is stored.

    """
    if not configurations:
        msg = "an experiment needs at least one configuration (worker, grader, rubric)"
        raise ValueError(msg)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not (
            1 <= repeats <= MAX_REPEATS):
        msg = f"repeats must be a whole number from 1 to {MAX_REPEATS}"
        raise ValueError(msg)
    if isinstance(dataset, str):
        dataset, version = store.load_dataset(dataset, dataset_version)
    else:
        version = None
    cells = len(dataset.rows) * len(configurations) * repeats
    if cells > MAX_CELLS:
        msg = (f"{len(dataset.rows)} rows × {len(configurations)} configuration(s) × {repeats} "
               f"repeat(s) is {cells:,} cells; an experiment holds at most {MAX_CELLS:,}: "
               "split the dataset or run fewer configurations")
        raise ValueError(msg)
    for config in configurations:
        for row in dataset.rows:
            config.settings_for(row).validate()
        session.build_spec(config.settings_for(dataset.rows[0]), models)
    if version is None:
        version = store.save_dataset(dataset)
    return store.create_experiment(
        name=name or dataset.name, dataset_name=dataset.name, dataset_version=version,
        configurations=configurations, repeats=repeats, row_ids=[r.id for r in dataset.rows],
    )


def retry_cell(store: Store, experiment_id: str, key: tuple[str, int, int]) -> str:
    """Make one ended cell run again from the start on a fresh thread (its old run stays).

    The next `run_experiment` runs it. Returns the new thread id.

    Raises:
        KeyError: No such cell.

    """
    return store.renew_cell_thread(experiment_id, key)


# -- running --------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Tally:
    """Cells of one configuration by how they ended (live progress; summary rows extend it)."""

    total: int = 0
    done: int = 0
    satisfied: int = 0
    errors: int = 0

    def add(self, status: str) -> None:
        """Count an ending (a status that is not one is ignored)."""
        if status in ENDED_STATUSES:
            self.done += 1
            self.satisfied += status == "satisfied"
            self.errors += status in ERROR_STATUSES


def _needs_run(cell: CellOutcome, retry_errors: bool) -> bool:
    return cell.status not in ENDED_STATUSES or (retry_errors and cell.status in ERROR_STATUSES)


def run_experiment(
    store: Store,
    experiment_id: str,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    per_model: Mapping[str, int] | None = None,
    models: session.ModelResolver | None = None,
    backoff: SharedBackoff | None = None,
    retry_errors: bool = False,
    stop: threading.Event | None = None,
) -> Iterator[ExperimentEvent]:
    """Run (or continue) an experiment's cells, yielding progress as cells end.

    Closing the iterator early is Stop: running cells are closed (their runs become
    ``interrupted``) and the experiment ``stopped``; calling this again continues it.

    Args:
        store: The database.
        experiment_id: The experiment.
        concurrency: Cells run at once (1 to `MAX_CONCURRENCY`).
        per_model: At most this many cells at once using a model (worker or grader), by model
            string.
        models: Builds the chat models (`experiment_models(backoff)` when omitted; a custom
            resolver gets the shared backoff only if it uses ``backoff.http_client()``).
        backoff: The shared backoff (a new `SharedBackoff` when omitted).
        retry_errors: Also run again the cells that ended ``error`` (continuing their
            threads) or ``grader_error`` (on a fresh thread).
        stop: Set it (from any thread) to stop, like closing the iterator.

    Yields:
        ``experiment_progress`` for every configuration at the start and after each cell,
        ``cell_finished``, ``experiment_backoff``, and one ``experiment_finished`` at the end.

    Raises:
        KeyError: No such experiment.
        ValueError: A bad concurrency or per-model limit.

    """
    experiment = _require_experiment(store, experiment_id)
    if not 1 <= concurrency <= MAX_CONCURRENCY or any(
            not 1 <= n <= MAX_CONCURRENCY for n in (per_model or {}).values()):
        msg = f"concurrency and per-model limits must be from 1 to {MAX_CONCURRENCY}"
        raise ValueError(msg)
    backoff = backoff or SharedBackoff()
    models = models or experiment_models(backoff)
    stop = stop or threading.Event()
    events: queue.Queue[ExperimentEvent | None] = queue.Queue()

    def on_backoff(status_code: int, wait_s: float, hits: int) -> None:
        events.put({"type": "experiment_backoff", "status_code": status_code,
                    "wait_s": round(wait_s, 3), "hits": hits})

    backoff.listeners.append(on_backoff)
    driver = _Driver(store, experiment, models, stop, events, concurrency, dict(per_model or {}),
                     retry_errors)
    running = asyncio.run_coroutine_threadsafe(driver.run(), _experiment_loop())
    try:
        while (event := events.get()) is not None:
            yield event
    finally:
        stop.set()
        running.result()  # driver.run() keeps its failure instead of raising
        backoff.listeners.remove(on_backoff)
        if driver.failure is not None:
            raise driver.failure


async def _outcome(run: session.AsyncSession) -> tuple[str, str | None]:
    """Consume a cell's run: its final (status, error)."""
    status, error = "interrupted", None
    try:
        async for event in run:
            if event["type"] == "run_finished":
                status, error = event["status"], event["error"]
    except Exception as exc:  # recorded as the run's error by the session layer
        status, error = "error", error_text(exc)
    finally:
        await run.aclose()
    return status, error


_loop_lock = threading.Lock()
_loop_holder: list[asyncio.AbstractEventLoop] = []


def _experiment_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for experiments, running in a daemon thread (started once).

    One loop for the life of the process, not one per `run_experiment`: the async HTTP
    clients of the chat models (pooled connections) belong to the loop that opened them, and
    models are kept between runs of an experiment.
    """
    with _loop_lock:
        if not _loop_holder:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="experiments-loop",
                             daemon=True).start()
            _loop_holder.append(loop)
        return _loop_holder[0]


class _Driver:
    """Runs one session of an experiment as a coroutine on the experiments' loop."""

    def __init__(self, store: Store, experiment: ExperimentRecord,
                 models: session.ModelResolver, stop: threading.Event,
                 events: queue.Queue[ExperimentEvent | None], concurrency: int,
                 per_model: dict[str, int], retry_errors: bool) -> None:
        self.store, self.experiment, self.models, self.stop = store, experiment, models, stop
        self.events, self.concurrency, self.per_model = events, concurrency, per_model
        self.retry_errors = retry_errors
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """This worker's name on the leases it holds."""
        self.failure: BaseException | None = None
        self.started = time.monotonic()

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
            self.events.put(finished)
            self.events.put(None)

    async def _main(self) -> str:
        exp, store = self.experiment, self.store
        dataset, _ = await store.acall(store.load_dataset, exp.dataset_name, exp.dataset_version)
        rows = {r.id: r for r in dataset.rows}
        await store.acall(store.set_experiment_status, exp.experiment_id, "running")
        # lean: no settings decoded
        cells = await store.acall(store.cell_outcomes, exp.experiment_id)
        self.tallies = [_Tally() for _ in exp.configurations]
        # The cells this worker may still claim, with the run each had when it started (a
        # cell another worker ended since is counted, not run again).
        self.left: dict[tuple[str, int, int], str | None] = {}
        for cell in cells:
            self.tallies[cell.config_index].total += 1
            if _needs_run(cell, self.retry_errors):
                self.left[cell.key] = cell.run_id
            else:
                self.tallies[cell.config_index].add(cell.status)
        self.remaining, self.finished_here = len(self.left), 0
        for index in range(len(exp.configurations)):
            self.events.put(self._progress(index))
        self.held: dict[tuple[str, int, int], threading.Event] = {}
        model_limits = {m: asyncio.Semaphore(n) for m, n in self.per_model.items()}
        slots = min(self.concurrency, len(self.left))
        helpers = [asyncio.create_task(self._renew_leases()),
                   asyncio.create_task(self._watch_elsewhere())]
        try:
            await asyncio.gather(*(self._slot(rows, model_limits) for _ in range(slots)))
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

    async def _slot(self, rows: dict[str, DatasetRow],
                    model_limits: dict[str, asyncio.Semaphore]) -> None:
        """Claim a cell, run it, release it; until none is left or Stop."""
        exp_id = self.experiment.experiment_id
        while not self.stop.is_set() and self.left:
            cell = await self.store.acall(self._claim)
            if cell is None:  # the rest are leased by other workers: wait for them or their expiry
                await self._count_ended_elsewhere()
                if self.left:
                    await asyncio.sleep(_CLAIM_POLL_S)
                continue
            self.left.pop(cell.key, None)
            lost = self.held[cell.key] = threading.Event()
            try:
                await self._cell(cell, rows[cell.row_id], model_limits, lost)
            finally:
                del self.held[cell.key]
                with contextlib.suppress(StoreError):
                    await self.store.acall(self.store.release_cell, exp_id, cell.key,
                                            self.owner)

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

    async def _cell(self, cell: CellRecord, row: DatasetRow,
                    model_limits: dict[str, asyncio.Semaphore], lost: threading.Event) -> None:
        config = self.experiment.configurations[cell.config_index]
        names = sorted({config.worker_model, config.grader_model} & model_limits.keys())
        async with contextlib.AsyncExitStack() as stack:
            for name in names:  # always in the same order, so no two cells deadlock
                await stack.enter_async_context(model_limits[name])
            if self.stop.is_set():
                return
            status, run_id, error = await self._run_cell(cell, self._settings(cell, row), lost)
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
        config = self.experiment.configurations[cell.config_index]
        repeat = f" · #{cell.repeat_index + 1}" if self.experiment.repeats > 1 else ""
        return config.settings_for(row).replace(
            title=f"{self.experiment.name} · {row.id} · {config.display_label()}{repeat}")

    async def _run_cell(self, cell: CellRecord, settings: RunSettings, lost: threading.Event
                        ) -> tuple[str, str | None, str | None]:
        """One cell: start, continue or skip its run; (status, run, error).

        Stop or a lost lease ends the run after the step in progress (never halfway through
        one), recorded ``interrupted``; the next Resume continues its thread from there.
        """
        store, thread_id = self.store, cell.thread_id

        def stopping() -> bool:
            return self.stop.is_set() or lost.is_set()

        record = await store.acall(store.latest_run_for_thread, thread_id)
        if record is not None and record.status == "grader_error" and self.retry_errors:
            thread_id = await store.acall(store.renew_cell_thread, cell.experiment_id,
                                          cell.key)
            record = None
        if record is None:
            run = await session.astart(store, settings, models=self.models, thread_id=thread_id,
                                       stop=stopping)
        elif record.status in TERMINAL_STATUSES:
            return record.status, record.run_id, record.error
        else:
            opened = await self._resume(record.run_id, stopping)
            if opened is None:
                return "interrupted", record.run_id, None
            run = opened
        status, error = await _outcome(run)
        return status, run.run_id, error

    async def _resume(self, run_id: str, stop: Callable[[], bool]
                      ) -> session.AsyncSession | None:
        """Resume a cell's run, waiting for a lost owner's run to go stale; None on Stop."""
        while not self.stop.is_set():
            try:
                return await session.aresume(self.store, run_id, models=self.models, stop=stop)
            except RuntimeError:  # still 'running' for another process, or not yet stale
                await asyncio.sleep(_STALE_POLL_S)
        return None

    def _progress(self, index: int) -> ExperimentProgress:
        tally = self.tallies[index]
        elapsed = time.monotonic() - self.started
        eta = (round(self.remaining * elapsed / self.finished_here, 1)
               if self.finished_here else None)
        return {"type": "experiment_progress", "experiment_id": self.experiment.experiment_id,
                "config_index": index,
                "label": self.experiment.configurations[index].display_label(),
                "done": tally.done, "total": tally.total, "satisfied": tally.satisfied,
                "errors": tally.errors,
                "satisfied_rate": round(tally.satisfied / tally.done, 4) if tally.done else None,
                "eta_s": eta}


# -- results --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExperimentResults:
    """An experiment's cells with their runs' totals and last grading runs, and their tables.

    Read in one query (`Store.cell_outcomes`), without run settings or answers; each table is
    one pass over the cells, so a results page of thousands of cells stays quick.
    """

    experiment: ExperimentRecord
    """The experiment."""
    cells: list[CellOutcome]
    """Every cell, in run order (with the passes of its run's last grading run when
    `verdicts`)."""
    verdicts: bool = True
    """Whether the cells' passes were read: `summary` and `criteria` need them."""

    def grid(self) -> pd.DataFrame:
        """One row per cell: row, configuration, repeat, status, passes, tokens, time, run id."""
        labels = [c.display_label() for c in self.experiment.configurations]
        cells = self.cells
        return pd.DataFrame({
            "row_id": [c.row_id for c in cells],
            "config_index": [c.config_index for c in cells],
            "configuration": [labels[c.config_index] for c in cells],
            "repeat_index": [c.repeat_index for c in cells],
            "status": [c.status for c in cells],
            "passes": [c.iterations for c in cells],
            "tokens": [None if c.input_tokens is None else c.input_tokens + (c.output_tokens or 0)
                       for c in cells],
            "duration_s": [c.duration_s for c in cells],
            "run_id": [c.run_id for c in cells],
        }, columns=["row_id", "config_index", "configuration", "repeat_index", "status",
                    "passes", "tokens", "duration_s", "run_id"])

    def ended(self) -> int:
        """Cells whose run ended (in `ENDED_STATUSES`)."""
        return sum(c.status in ENDED_STATUSES for c in self.cells)

    def summary(self) -> pd.DataFrame:
        """Per configuration (`SUMMARY_COLUMNS`); percentages over the cells that ended.

        Raises:
            ValueError: The results were read without their verdicts.

        """
        self._need_verdicts()
        tallies = [_ConfigTally() for _ in self.experiment.configurations]
        for c in self.cells:
            tallies[c.config_index].add_cell(c)
        records = [{
            "config_index": index, "configuration": config.display_label(),
            "worker_model": config.worker_model, "grader_model": config.grader_model,
            "cells": t.total, "done": t.done,
            "satisfied_pct": _pct(t.satisfied, t.done),
            "first_pass_satisfied_pct": _pct(t.first_ok, t.done),
            "mean_passes": round(t.passes / t.done, 3) if t.done else None,
            "errors": t.errors, "input_tokens": t.input_tokens, "output_tokens": t.output_tokens,
            "mean_duration_s": (round(sum(t.durations) / len(t.durations), 3)
                                if t.durations else None),
        } for (index, config), t in zip(enumerate(self.experiment.configurations), tallies,
                                        strict=True)]
        return pd.DataFrame.from_records(records, columns=list(SUMMARY_COLUMNS))

    def criteria(self) -> pd.DataFrame:
        """Per configuration and criterion (`CRITERIA_COLUMNS`), in order of first appearance.

        Over each cell's last grading run: the pass rate at its first pass and at its last
        graded pass, and the mean passes needed to fix the criterion as
        `rubric_core.analytics.loop_analytics` defines it (from the first pass that fails it
        to the first later pass that passes it; cells where it never failed, or never got
        fixed, do not count). Criteria are matched by `rubric.normalize_name`. One pass over
        the cells: `loop_analytics` over every pass would cost several times more.

        Raises:
            ValueError: The results were read without their verdicts.

        """
        self._need_verdicts()
        keys: dict[str, str] = {}  # criterion name → normalized name, each computed once
        records: list[tuple[Any, ...]] = []
        for index in range(len(self.experiment.configurations)):
            tallies: dict[str, _CriterionTally] = {}
            for cell in self.cells:
                if cell.config_index == index and cell.passes and cell.passes[0][1]:
                    _tally_cell(cell.passes, tallies, keys)
            records += [t.row(index) for t in tallies.values()]
        return pd.DataFrame.from_records(records, columns=list(CRITERIA_COLUMNS))

    def outcomes(self, config_index: int) -> dict[str, bool]:
        """``row_id`` (``row_id#repeat`` with repeats) → satisfied, for the cells that ended."""
        out = {}
        for c in self.cells:
            if c.config_index == config_index and c.status in ENDED_STATUSES:
                key = c.row_id if self.experiment.repeats == 1 else f"{c.row_id}#{c.repeat_index}"
                out[key] = c.status == "satisfied"
        return out

    def compare(self, a: int, b: int) -> Comparison:
        """Configuration ``a`` against ``b`` on the rows both ended: flips and McNemar's p."""
        return compare_outcomes(self.outcomes(a), self.outcomes(b))

    def _need_verdicts(self) -> None:
        if not self.verdicts:
            msg = "these results were read without verdicts: use experiment_results(verdicts=True)"
            raise ValueError(msg)


@dataclasses.dataclass
class _ConfigTally(_Tally):
    """One configuration's row of `ExperimentResults.summary`, added up cell by cell."""

    first_ok: int = 0
    passes: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    durations: list[float] = dataclasses.field(default_factory=list)

    def add_cell(self, cell: CellOutcome) -> None:
        self.total += 1
        self.add(cell.status)
        if cell.status not in ENDED_STATUSES:
            return
        self.first_ok += bool(cell.passes) and cell.passes[0][0] == "satisfied"
        self.passes += len(cell.passes)
        self.input_tokens += cell.input_tokens or 0
        self.output_tokens += cell.output_tokens or 0
        if cell.duration_s is not None:
            self.durations.append(cell.duration_s)


def _pct(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 2) if whole else None


@dataclasses.dataclass
class _CriterionTally:
    """One criterion's row of `ExperimentResults.criteria` within a configuration."""

    name: str
    cells: int = 0
    first_graded: int = 0
    first_passed: int = 0
    last_graded: int = 0
    last_passed: int = 0
    fixes: list[int] = dataclasses.field(default_factory=list)

    def row(self, config_index: int) -> tuple[Any, ...]:
        return (config_index, self.name, self.cells, _share(self.first_passed, self.first_graded),
                _share(self.last_passed, self.last_graded),
                round(sum(self.fixes) / len(self.fixes), 4) if self.fixes else None)


def _tally_cell(passes: Sequence[PassVerdicts], tallies: dict[str, _CriterionTally],
                keys: dict[str, str]) -> None:
    """Add one cell's last grading run (its first pass has verdicts) to ``tallies``."""
    seen: set[str] = set()
    first_fail: dict[str, int] = {}
    fixed: set[str] = set()
    for i, (_, verdicts) in enumerate(passes):
        for c in verdicts:
            key = _criterion_key(c["name"], keys)
            tally = tallies.get(key)
            if tally is None:
                tally = tallies[key] = _CriterionTally(c["name"])
            if key not in seen:
                seen.add(key)
                tally.cells += 1
            if i == 0:
                tally.first_graded += 1
                tally.first_passed += bool(c["passed"])
            if not c["passed"]:
                first_fail.setdefault(key, i)
            elif key in first_fail and key not in fixed:
                fixed.add(key)
                tally.fixes.append(i - first_fail[key])
    for c in next(v for _, v in reversed(passes) if v):
        tally = tallies[_criterion_key(c["name"], keys)]
        tally.last_graded += 1
        tally.last_passed += bool(c["passed"])


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _criterion_key(name: str, keys: dict[str, str]) -> str:
    """`normalize_name`, remembered: an experiment repeats the same few names many times."""
    key = keys.get(name)
    if key is None:
        key = keys[name] = normalize_name(name)
    return key


def experiment_results(store: Store, experiment_id: str, *,
                       verdicts: bool = True) -> ExperimentResults:
    """The experiment's cells with their last grading runs, read once, for the result tables.

    Args:
        store: The database.
        experiment_id: The experiment.
        verdicts: Also read every cell's last grading run, which `ExperimentResults.summary`
            and `ExperimentResults.criteria` need; the grid, `compare` and the counts do not
            (without, the read costs about a third).

    Raises:
        KeyError: No such experiment.

    """
    experiment = _require_experiment(store, experiment_id)
    cells = store.cell_outcomes(experiment_id, verdicts=verdicts)
    return ExperimentResults(experiment, cells, verdicts)


# -- export ---------------------------------------------------------------------------------------


def export_columns(store: Store, experiment_id: str) -> tuple[str, ...]:
    """Columns of `export_experiment_rows`.

    The cell's columns, ``row_<column>`` for each dataset column (``row_id``, ``row_prompt``,
    ...), then `rubric_core.export.EXPORT_COLUMNS`.

    Raises:
        KeyError: No such experiment.

    """
    _, dataset = _experiment_and_dataset(store, experiment_id)
    return (*_CELL_COLUMNS, *_data_columns(dataset), *EXPORT_COLUMNS)


def _data_columns(dataset: Dataset) -> list[str]:
    names = ["id", "prompt", "rubric", *(c for c in dataset.columns
                                         if c not in ("id", "prompt", "rubric"))]
    return [f"row_{name}" for name in names]


def export_experiment_rows(store: Store, experiment_id: str) -> Iterator[tuple[Any, ...]]:
    """One row per dataset row × configuration × repeat × pass × criterion, produced lazily.

    Cells, their runs and evaluations are read from the store a hundred at a time, so memory
    stays flat in the rows written. Pass the rows to `rubric_core.export.write_csv`
    (formula-safe) or ``write_json`` with `export_columns`. Text cells are scrubbed of secrets.

    Raises:
        KeyError: No such experiment.

    """
    experiment, dataset = _experiment_and_dataset(store, experiment_id)
    names = [c.removeprefix("row_") for c in _data_columns(dataset)]
    rows = {r.id: r for r in dataset.rows}
    labels = [c.display_label() for c in experiment.configurations]
    for start in itertools.count(0, _RUNS_PER_READ):
        # A page of cells at a time too: each record carries its run's whole settings.
        page = store.experiment_cells(experiment_id, offset=start, limit=_RUNS_PER_READ)
        if not page:
            return
        chunk = [c for c in page if c.run is not None]
        by_run = store.evaluations_for_runs(c.run.run_id for c in chunk if c.run)
        for cell in chunk:
            assert cell.run is not None
            row = rows.get(cell.row_id)
            record = ({} if row is None else
                      {"id": row.id, "prompt": row.prompt, "rubric": row.rubric, **row.variables})
            head = (experiment.experiment_id, labels[cell.config_index], cell.config_index,
                    cell.repeat_index, *(_text(record.get(n)) for n in names))
            for line in export_rows([(cell.run, by_run[cell.run.run_id])]):
                yield (*head, *line)


def summary_rows(results: ExperimentResults) -> Iterator[tuple[Any, ...]]:
    """`ExperimentResults.summary` as rows in `SUMMARY_COLUMNS` order, for ``write_csv``."""
    frame = results.summary().astype(object).where(lambda f: f.notna(), None)
    for values in frame.itertuples(index=False, name=None):
        yield tuple(_text(v) for v in values)


def _text(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


__all__ = [
    "CRITERIA_COLUMNS", "DEFAULT_CONCURRENCY", "ENDED_STATUSES", "ERROR_STATUSES",
    "RETRY_STATUS_CODES", "SUMMARY_COLUMNS", "ExperimentResults", "SharedBackoff",
    "create_experiment", "experiment_models", "experiment_results", "export_columns",
    "export_experiment_rows", "retry_cell", "run_experiment", "summary_rows",
]
