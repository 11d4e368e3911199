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
from typing import TYPE_CHECKING, NamedTuple

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


__all__ = ["STALE_POLL_S", "CellEnding", "cell_settings", "run_cell", "run_outcome"]
