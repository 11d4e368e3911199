"""One experiment cell, run to its end: start its run, continue it, or report the one that ended.

The body of the queue engine's cell workflow (`rubric_core.engine.cell`), kept apart from DBOS:
it knows runs and threads, not queues. Whoever calls it has already decided that the cell
should run; the body decides how, from what the cell's thread holds now:

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
from typing import TYPE_CHECKING

from rubric_core import session
from rubric_core.redact import error_text
from rubric_core.store import ThreadTaken, is_unavailable
from rubric_core.types import TERMINAL_STATUSES

if TYPE_CHECKING:
    from collections.abc import Callable

    from rubric_core.datasets import DatasetRow
    from rubric_core.settings import RunSettings
    from rubric_core.store import ExperimentRecord, RunRecord, Store
    from rubric_core.types import ModelResolver

CellOutcomeTuple = tuple[str, str | None, str | None]
"""How a cell's run ended here: ``(status, run id, error)``."""

STALE_POLL_S = 1.0
"""How often a cell whose run another owner holds looks again (for its end or its staleness)."""


async def run_outcome(run: session.AsyncSession) -> tuple[str, str | None]:
    """Consume a cell's run: its final (status, error)."""
    status, error = "interrupted", None
    try:
        async for event in run:
            if event["type"] == "run_finished":
                status, error = event["status"], event["error"]
    except Exception as exc:  # recorded as the run's error by the session layer
        # A lost database interrupts the cell (Resume continues it); anything else fails it.
        status = "interrupted" if is_unavailable(exc) else "error"
        error = error_text(exc)
    finally:
        await run.aclose()
    return status, error


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
                   retry_errors: bool, stop: Callable[[], bool]) -> CellOutcomeTuple:
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
        ``(status, run id, error)``: the run's status as it ended here (``interrupted`` when
        stopped), its id (None when no run was started), its error text.

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
            return record.status, record.run_id, record.error
        if stop():
            return "interrupted", record.run_id, None
        try:
            run = await session.aresume(store, record.run_id, models=models, stop=stop)
            break
        except RuntimeError:  # still 'running' for another owner, or not yet stale
            await asyncio.sleep(STALE_POLL_S)
        latest = await store.acall(store.latest_run_for_thread, thread_id)
        record = latest or record
    status, error = await run_outcome(run)
    return status, run.run_id, error


__all__ = ["STALE_POLL_S", "CellOutcomeTuple", "cell_settings", "run_cell", "run_outcome"]
