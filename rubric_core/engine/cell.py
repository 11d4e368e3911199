"""The cell workflow: one experiment cell as a DBOS workflow, on whichever process dequeues it.

The workflow's inputs are ids only (experiment, row, configuration, repeat, thread, whether
errors are retried); its body is the one both schedulers share
(`rubric_core.experiments.cell.run_cell`), and its result the cell's ``status``, ``run_id`` and
``error`` as it ended there. The body writes only our own tables, through our run ownership and
fenced checkpoints: DBOS fences its own rows, not ours, so a paused worker whose workflow was
recovered elsewhere is stopped by the run's owner check, exactly as on the lease queue.

What a cell needs beyond its ids comes from this process's `ExperimentContext` for its
experiment: the experiment and its dataset's rows, the chat models, per-model limits (per
process in this preview) and the listener that turns a cell's end into the driver's events.
The process driving the experiment (`rubric_core.engine.driver`) attaches its own (its models,
with the caller's key); any other process (a ``rubric-studio worker``) builds one from the
database and the environment's keys on the experiment's first cell.

Budget: right before the body runs, `rubric_core.engine.budget.admit` decides, over every
process, whether the cell fits in its experiment's budget; a cell that does not ends unstarted
(its result's status ``budget_reached``), left for a Resume.

Stop: cancelling a workflow in DBOS does not interrupt its body (it has no DBOS steps), so each
process watches the workflows it runs (`_watch_cancellations`, one query every
`CANCEL_POLL_S` while cells run) and sets the stop of a cancelled one: its run ends after the
step in progress, recorded ``interrupted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any

from dbos import DBOS

from rubric_core.consensus import REPEATS_IN_SEQUENCE
from rubric_core.engine.budget import admit
from rubric_core.experiments.cell import cell_settings, run_cell

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from rubric_core.datasets import DatasetRow
    from rubric_core.settings import RunSettings
    from rubric_core.store import ExperimentRecord, Store
    from rubric_core.types import ModelResolver

CELL_WORKFLOW = "rubric_studio.cell"
"""The cell workflow's registered name (stored with every queued cell: never rename it)."""

CANCEL_POLL_S = 0.5
"""How often a process asks whether the cells it runs were cancelled (Stop)."""


@dataclasses.dataclass(eq=False)
class ExperimentContext:
    """What this process needs to run an experiment's cells (see the module docstring)."""

    experiment: ExperimentRecord
    rows: Mapping[str, DatasetRow]
    models: ModelResolver
    model_limits: dict[str, asyncio.Semaphore] = dataclasses.field(default_factory=dict)
    """Per model string: the cells of this experiment that may use it at once here."""
    on_finished: Callable[[tuple[str, int, int], str, str | None, str | None], None] | None = None
    """Called (on the loop) with ``(key, status, run_id, error)`` when a cell ends here."""
    stopping: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set by the driver's Stop: this process's cells of the experiment end after their step."""
    running: int = 0
    """Cells of this experiment running here now."""
    idle: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set whenever no cell of this experiment runs here."""

    def settings_for(self, key: tuple[str, int, int]) -> RunSettings:
        """A cell's run settings (`rubric_core.experiments.cell.cell_settings`)."""
        return cell_settings(self.experiment, self.rows[key[0]], key)


# Touched on the work loop only.
_contexts: dict[str, ExperimentContext] = {}
_running: dict[str, threading.Event] = {}  # workflow id -> its stop, for the cells running here
_watcher: list[asyncio.Task[None]] = []
_leaving = threading.Event()  # this process stops taking part: its cells are left for recovery


def attach(context: ExperimentContext) -> None:
    """Make ``context`` the one this process's cells of its experiment use (a driver's)."""
    context.idle.set()
    _contexts[context.experiment.experiment_id] = context


def detach(context: ExperimentContext) -> None:
    """Forget ``context`` (a driver that ended); later cells here build a default one."""
    if _contexts.get(context.experiment.experiment_id) is context:
        del _contexts[context.experiment.experiment_id]


async def _context(store: Store, experiment_id: str) -> ExperimentContext:
    context = _contexts.get(experiment_id)
    if context is None:
        from rubric_core.experiments.create import require_experiment
        from rubric_core.experiments.scheduler import experiment_models
        from rubric_core.http_retry import SharedBackoff

        experiment = await store.acall(require_experiment, store, experiment_id)
        dataset, _ = await store.acall(store.load_dataset, experiment.dataset_name,
                                       experiment.dataset_version)
        context = _contexts.setdefault(experiment_id, ExperimentContext(
            experiment=experiment, rows={r.id: r for r in dataset.rows},
            models=experiment_models(SharedBackoff())))
        context.idle.set()
    return context


async def _watch_cancellations() -> None:
    """Set the stop of every cell running here whose workflow was cancelled (Stop)."""
    while _running:
        await asyncio.sleep(CANCEL_POLL_S)
        ids = list(_running)
        if not ids:
            break
        with contextlib.suppress(Exception):  # a busy database: the next round asks again
            for status in await DBOS.list_workflows_async(
                    workflow_ids=ids, status="CANCELLED", load_input=False, load_output=False):
                if (stop := _running.get(status.workflow_id)) is not None:
                    stop.set()
    _watcher.clear()


def _ensure_watcher() -> None:
    if not _watcher or _watcher[0].done():
        _watcher.clear()
        loop = asyncio.get_running_loop()
        # An empty context: the watcher must not run as a step of the workflow that starts it.
        _watcher.append(contextvars.Context().run(loop.create_task, _watch_cancellations()))


def rejoin() -> None:
    """Take part again after `leave` (a new launch of the engine in this process)."""
    _leaving.clear()


async def leave(timeout_s: float = 30.0) -> int:
    """Stop every cell running here after its step, leaving its workflow for recovery.

    Cells dequeued from now on start nothing. Returns how many cells were still running when
    ``timeout_s`` ran out (0 when every one ended its step).
    """
    _leaving.set()
    for stop in list(_running.values()):
        stop.set()
    deadline = time.monotonic() + timeout_s
    while _running and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return len(_running)


@DBOS.workflow(name=CELL_WORKFLOW)
async def cell_workflow(experiment_id: str, row_id: str, config_index: int, repeat_index: int,
                        thread_id: str, retry_errors: bool) -> dict[str, Any]:
    """Run one cell to its end here (see the module docstring); its status, run and error."""
    from rubric_core.engine.launch import current_engine

    engine = current_engine()
    if engine is None:  # pragma: no cover - DBOS runs workflows only once launched
        msg = "the queue engine is not launched in this process"
        raise RuntimeError(msg)
    key = (row_id, int(config_index), int(repeat_index))
    context = await _context(engine.store, experiment_id)
    workflow_id = DBOS.workflow_id or ""
    stop = _running[workflow_id] = threading.Event()
    _ensure_watcher()
    context.running += 1
    context.idle.clear()
    status, run_id, error = "interrupted", None, None
    refused = False
    try:
        config = context.experiment.configurations[key[1]]
        names = sorted({config.worker_model, config.grader_model} & context.model_limits.keys())
        async with contextlib.AsyncExitStack() as stack:
            for name in names:  # always in the same order, so no two cells deadlock
                await stack.enter_async_context(context.model_limits[name])

            def stopping() -> bool:
                return stop.is_set() or context.stopping.is_set() or _leaving.is_set()

            refused = not stopping() and not await admit(engine.store, experiment_id, key,
                                                         workflow_id)
            if not stopping() and not refused:
                # A cell is one request in flight: grader repeats wait for each other.
                REPEATS_IN_SEQUENCE.set(True)
                status, run_id, error = await run_cell(
                    engine.store, experiment_id=experiment_id, key=key, thread_id=thread_id,
                    settings=context.settings_for(key), models=context.models,
                    retry_errors=retry_errors, stop=stopping)
    finally:
        _running.pop(workflow_id, None)
        context.running -= 1
        if context.running == 0:
            context.idle.set()
    if refused:  # unstarted, left for a Resume; the driver reports the budget reached
        return {"status": "budget_reached", "run_id": None, "error": None}
    if _leaving.is_set():
        # Never completes: the workflow stays PENDING on this executor, which recovery hands
        # to another process once this one has exited (`rubric_core.engine.worker`).
        await asyncio.Event().wait()
    if context.on_finished is not None:
        context.on_finished(key, status, run_id, error)
    return {"status": status, "run_id": run_id, "error": error}


__all__ = ["CANCEL_POLL_S", "CELL_WORKFLOW", "ExperimentContext", "attach", "cell_workflow",
           "detach", "leave", "rejoin"]
