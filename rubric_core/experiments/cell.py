"""One experiment cell, run to its end: start its run, continue it, or report the one that ended.

`CellBody` is what the queue engine runs for a cell (`rubric_core.engine.body`, registered at
import): the cell's batch (`CellBatch`: the experiment, its rows, its models, the driver's
listener), the budget's admission (`rubric_core.experiments.budget.admit_cell`), then
`run_cell`, which knows runs and threads, not queues. Whoever calls it has already decided that
the cell should run; it decides how, from what the cell's thread holds now:

- no run on the thread: start one (`rubric_core.session.astart`);
- a run that ended (a terminal verdict, or ``error`` unless errors are retried): report it,
  calling no model, so a cell handed out twice (a recovered workflow, a Resume racing a worker)
  is never run twice;
- a ``grader_error`` retried: a fresh thread, started over;
- otherwise (interrupted, ``error`` retried, or ``running`` for an owner that may be dead):
  continue the same run (`rubric_core.session.aresume`), waiting while another owner still holds
  it; its ending, when it comes, is reported as above.

``stop`` is asked after every step of the run (and while waiting): True ends the run there,
recorded ``interrupted``, resumable from that step.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple

from rubric_core import session
from rubric_core.consensus import REPEATS_IN_SEQUENCE
from rubric_core.engine import outage
from rubric_core.engine.body import CELL, Batch, register
from rubric_core.experiments.budget import admit_cell
from rubric_core.experiments.create import require_experiment
from rubric_core.http_retry import SharedBackoff
from rubric_core.models import model_resolver
from rubric_core.redact import error_text
from rubric_core.store import ThreadTaken, is_unavailable
from rubric_core.types import TERMINAL_STATUSES

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from rubric_core.datasets import DatasetRow
    from rubric_core.engine.body import Unit
    from rubric_core.settings import RunSettings
    from rubric_core.store import ExperimentRecord, RunRecord, Store
    from rubric_core.types import ModelResolver


class CellEnding(NamedTuple):
    """How a cell's run ended here."""

    status: str
    """The run's status (``interrupted`` when stopped, or cut by a lost database)."""
    run_id: str | None
    """Its run (None when none was started)."""
    error: str | None
    """Its error text."""
    lost_database: bool = False
    """The database went away under it: ``interrupted``, and a Resume continues it."""


STALE_POLL_S = 1.0
"""How often a cell whose run another owner holds looks again (for its end or its staleness)."""


async def run_outcome(run: session.AsyncSession) -> CellEnding:
    """Consume a cell's run: how it ended."""
    status, error, lost = "interrupted", None, False
    try:
        async for event in run:
            if event["type"] == "run_finished":
                status, error = event["status"], event["error"]
    except Exception as exc:  # recorded as the run's error by the session layer
        # A lost database interrupts the cell (Resume continues it); anything else fails it.
        lost = is_unavailable(exc)
        status = "interrupted" if lost else "error"
        error = error_text(exc)
    finally:
        await run.aclose()
    return CellEnding(status, run.run_id, error, lost)


def experiment_models(
    backoff: SharedBackoff, *, api_key: str | None = None, env_keys: bool = True
) -> ModelResolver:
    """Models for an experiment, as `rubric_core.models.model_resolver` builds them for one.

    OpenAI and OpenAI-compatible models (also inside ``hybrid:``) send through both HTTP
    clients of ``backoff`` (sync and async), which retry 429/5xx through the shared wait;
    nothing streams (nobody watches a cell's tokens); and each model string and endpoint gets
    one model for the whole experiment, so every cell of a configuration reuses one compiled
    agent. The app's experiments get the same through `rubric_core.app_support.app_models`.

    Args:
        backoff: The experiment's shared backoff.
        api_key: A key for the models' endpoint (never stored); the environment's otherwise.
        env_keys: Whether a base URL may receive ``OPENAI_API_KEY`` from the environment.

    """
    return model_resolver(api_key=api_key, env_keys=env_keys, backoff=backoff, share=True,
                          streaming=False)


def cell_settings(experiment: ExperimentRecord, row: DatasetRow, key: tuple[str, int, int]
                  ) -> RunSettings:
    """A cell's run settings: its configuration filled in with its row, titled for Review."""
    config = experiment.configurations[key[1]]
    repeat = f" · #{key[2] + 1}" if experiment.repeats > 1 else ""
    return config.settings_for(row).replace(
        title=f"{experiment.name} · {row.id} · {config.display_label()}{repeat}")


def _ended(record: RunRecord, retry_errors: bool) -> bool:
    return record.status in TERMINAL_STATUSES or (record.status == "error" and not retry_errors)


async def run_cell(store: Store, *, experiment_id: str, key: tuple[str, int, int],
                   thread_id: str, settings: RunSettings, models: ModelResolver,
                   retry_errors: bool, stop: Callable[[], bool]) -> CellEnding:
    """Run one cell to its end, or until ``stop`` (see the module docstring).

    Args:
        store: The database.
        experiment_id: The cell's experiment.
        key: The cell: ``(row id, configuration index, repeat index)``.
        thread_id: The cell's thread as the caller read it.
        settings: The run's settings (the configuration filled in with the row, titled).
        models: Builds the chat models.
        retry_errors: Run again a run that ended ``error`` (continuing its thread) or
            ``grader_error`` (on a fresh thread).
        stop: Asked after every step; True ends the run there.

    Returns:
        The run's status as it ended here (``interrupted`` when stopped), its id (None when no
        run was started), its error text.

    """
    record = await store.acall(store.latest_run_for_thread, thread_id)
    if record is not None and record.status == "grader_error" and retry_errors:
        thread_id = await store.acall(store.renew_cell_thread, experiment_id, key)
        record = None
    while True:
        if record is None:
            try:
                # Only if the thread has no run yet: this read may be old (a worker paused
                # after it while another started the cell, and maybe finished it).
                run = await session.astart(store, settings, models=models,
                                           thread_id=thread_id, stop=stop, fresh_thread=True)
                break
            except ThreadTaken:
                record = await store.acall(store.latest_run_for_thread, thread_id)
                continue
        if _ended(record, retry_errors):
            return CellEnding(record.status, record.run_id, record.error)
        if stop():
            return CellEnding("interrupted", record.run_id, None)
        try:
            run = await session.aresume(store, record.run_id, models=models, stop=stop)
            break
        except RuntimeError:  # still 'running' for another owner, or not yet stale
            await asyncio.sleep(STALE_POLL_S)
        latest = await store.acall(store.latest_run_for_thread, thread_id)
        record = latest or record
    return await run_outcome(run)


@dataclasses.dataclass(eq=False)
class CellBatch(Batch):
    """What this process needs to run an experiment's cells."""

    experiment: ExperimentRecord
    """The experiment."""
    rows: Mapping[str, DatasetRow]
    """Its dataset's rows by id."""
    models: ModelResolver
    """Builds the chat models."""
    on_finished: Callable[[tuple[str, int, int], CellEnding], None] | None = None
    """Called (on the loop) with the cell's key and how it ended, when a cell ends here."""

    def settings_for(self, key: tuple[str, int, int]) -> RunSettings:
        """A cell's run settings (`cell_settings`)."""
        return cell_settings(self.experiment, self.rows[key[0]], key)


class CellBody:
    """The engine's body for cells (`rubric_core.engine.body.Body`)."""

    halted = None  # a halted cell's run ends after its step, recorded ``interrupted``

    async def load(self, store: Store, batch_id: str) -> CellBatch:
        """A batch built from the stored experiment (a worker's), with models of this process."""
        experiment = await store.acall(require_experiment, store, batch_id)
        dataset, _ = await store.acall(store.load_dataset, experiment.dataset_name,
                                       experiment.dataset_version)
        return CellBatch(batch_id, experiment=experiment, rows={r.id: r for r in dataset.rows},
                         models=experiment_models(SharedBackoff()))

    async def run(self, unit: Unit) -> dict[str, Any]:
        """Admit the cell under its budget and run it; its status, run and error."""
        from rubric_core.engine.runtime import is_cancelled

        batch = unit.batch
        assert isinstance(batch, CellBatch)
        row_id, config_index, repeat_index, thread_id, retry_errors = unit.args
        key = (row_id, int(config_index), int(repeat_index))
        if unit.parent is not None and not unit.stopping() and await is_cancelled(unit.parent):
            unit.stop.set()  # queued by a level just after a Stop cancelled the cell
        ending = CellEnding("interrupted", None, None)
        try:
            if not unit.stopping() and not await admit_cell(unit.store, batch.batch_id, key,
                                                             unit.unit_id):
                unit.unstarted = True  # left for a Resume; the driver reports the budget
                return {"status": "budget_reached", "run_id": None, "error": None}
            if not unit.stopping():
                REPEATS_IN_SEQUENCE.set(True)  # a cell is one request in flight
                ending = await run_cell(
                    unit.store, experiment_id=batch.batch_id, key=key, thread_id=thread_id,
                    settings=batch.settings_for(key), models=batch.models,
                    retry_errors=retry_errors, stop=unit.stopping)
        except Exception as exc:
            # A lost database ends the cell where it stands, as a Stop would (no DBOS
            # traceback): a Resume continues it (`rubric_core.engine.outage`). Else a bug.
            if not is_unavailable(exc):
                raise
            ending = CellEnding("interrupted", ending.run_id, error_text(exc), True)
        if batch.on_finished is not None and not unit.leaving.is_set():
            batch.on_finished(key, ending)
        return self._result(batch.batch_id, ending)

    def lost(self, batch_id: str, exc: BaseException) -> dict[str, Any] | None:
        """A cell whose experiment could not be read for want of the database: cut."""
        if not (isinstance(exc, Exception) and is_unavailable(exc)):
            return None
        return self._result(batch_id, CellEnding("interrupted", None, error_text(exc), True))

    @staticmethod
    def _result(experiment_id: str, ending: CellEnding) -> dict[str, Any]:
        """The cell workflow's result; a cut cell's is said to this process's listener."""
        result: dict[str, Any] = {"status": ending.status, "run_id": ending.run_id,
                                  "error": ending.error}
        if ending.lost_database:
            outage.note_cut(experiment_id, ending.error or "")
            result[outage.LOST_KEY] = True
        return result

    async def beat(self, store: Store, batch_id: str) -> None:
        """Nothing: a cell's run keeps its own heartbeat."""


register(CELL, CellBody())

__all__ = ["STALE_POLL_S", "CellBatch", "CellBody", "CellEnding", "cell_settings",
           "experiment_models", "run_cell", "run_outcome"]
