"""The cell workflow: one experiment cell as a DBOS workflow, on whichever process dequeues it.

The workflow's inputs are ids only (experiment, row, configuration, repeat, thread, whether
errors are retried); its body is the one both schedulers share
(`rubric_core.experiments.cell.run_cell`), and its result the cell's ``status``, ``run_id`` and
``error`` as it ended there. The body writes only our own tables, through our run ownership and
fenced checkpoints: DBOS fences its own rows, not ours, so a paused worker whose workflow was
recovered elsewhere is stopped by the run's owner check (`rubric_core.store._fence`).

What a cell needs beyond its ids comes from this process's `ExperimentContext` for its
experiment: the experiment and its dataset's rows, the chat models and the listener that
turns a cell's end into the driver's events.

Per-model limits are DBOS's, over every process: partitions of the experiment's queue where
they suffice, else a queue per experiment and limited model (`rubric_core.engine.queues` says
which and why). With model queues, a cell passes through levels: its workflow, on the
experiment's queue (holding one of the experiment's slots), enqueues the same workflow as a
child on the first model's queue with the rest of its ``gates``, which enqueues the next, and
the innermost runs the cell's body; each level waits for its child's result and returns it
(woken at once by a child that ended in this process, else it asks every `RESULT_POLL_S`).
A child's ID is derived from its cell's workflow ID (`gate_id`): a recovered level
re-attaches to its child (DBOS records the child's start) instead of queuing it twice. Stop
cancels a cell's workflow with its children; the innermost level checks, before it starts the
body, that its cell's workflow was not cancelled (a child queued just after a Stop, or a cell
dequeued just before it, starts nothing).

Budget: right before the body runs, `rubric_core.engine.budget.admit` decides, over every
process, whether the cell fits in its experiment's budget; a cell that does not ends unstarted
(its result's status ``budget_reached``), left for a Resume.

Stop: cancelling a workflow in DBOS does not interrupt its body (it has no DBOS steps), so each
process watches the workflows it runs (`_watch_cancellations`, one query every
`CANCEL_POLL_S` while cells run) and sets the stop of a cancelled one: its run ends after the
step in progress, recorded ``interrupted``.

A lost database: the cell ends where it stands, as after a Stop, and its workflow completes
with ``lost_database`` in its result (`rubric_core.engine.outage`): DBOS logs no traceback, and
a Resume continues the cell on its own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

from dbos import DBOS, SetWorkflowID
from dbos import error as dbos_error

from rubric_core.consensus import REPEATS_IN_SEQUENCE
from rubric_core.engine import outage
from rubric_core.engine.budget import admit
from rubric_core.experiments.cell import CellEnding, cell_settings, run_cell
from rubric_core.redact import error_text
from rubric_core.store import is_unavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping

    from dbos import WorkflowHandleAsync

    from rubric_core.datasets import DatasetRow
    from rubric_core.settings import RunSettings
    from rubric_core.store import ExperimentRecord, Store
    from rubric_core.types import ModelResolver

T = TypeVar("T")

CELL_WORKFLOW = "rubric_studio.cell"
"""The cell workflow's registered name (stored with every queued cell: never rename it)."""

CANCEL_POLL_S = 0.5
"""How often a process asks whether the cells it runs were cancelled (Stop)."""

CELL_ID_PREFIX = "rubric-cell:"
"""What a cell's own workflow ID starts with (`rubric_core.engine.queues.workflow_id`)."""

GATE_ID_PREFIX = "rubric-gate:"
"""What the ID of a cell's child on a model's queue starts with (`gate_id`)."""

RESULT_POLL_S = 0.2
"""How often a cell's level waiting on a model's queue asks whether its child, running in
another process, ended (one indexed read per waiting level); a child in this process wakes
its level at once."""

ACTIVE_STATUSES = ("ENQUEUED", "PENDING", "DELAYED")
"""DBOS statuses of a workflow that has not ended."""


@dataclasses.dataclass(eq=False)
class ExperimentContext:
    """What this process needs to run an experiment's cells (see the module docstring)."""

    experiment: ExperimentRecord
    rows: Mapping[str, DatasetRow]
    models: ModelResolver
    on_finished: Callable[[tuple[str, int, int], CellEnding], None] | None = None
    """Called (on the loop) with the cell's key and how it ended, when a cell ends here."""
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
_running: dict[str, threading.Event] = {}  # cell's workflow id -> its stop (cells running here)
_watcher: list[asyncio.Task[None]] = []
_leaving = threading.Event()  # this process stops taking part: its cells are left for recovery
_ended: dict[str, asyncio.Event] = {}  # a level's child's workflow id -> set when it ended here


def gate_id(cell_id: str, level: int) -> str:
    """The ID of a cell's workflow's child at ``level`` (1: the first model's queue).

    Unique: a cell's workflow ID holds its thread, which no other cell has.
    """
    return GATE_ID_PREFIX + cell_id.removeprefix(CELL_ID_PREFIX) + f"#{level}"


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


async def _outside_workflow(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` outside the calling workflow: DBOS would record its calls as steps."""
    loop = asyncio.get_running_loop()
    return await contextvars.Context().run(loop.create_task, coro)


async def _cancelled(cell_id: str) -> bool:
    found = await DBOS.list_workflows_async(workflow_ids=[cell_id], status="CANCELLED",
                                            load_input=False, load_output=False)
    return bool(found)


async def _child_result(handle: WorkflowHandleAsync[dict[str, Any]]) -> dict[str, Any]:
    """A level's child's result; a child cancelled (Stop): its cell interrupted.

    A child that ends in this process says so at once (`_ended`), and DBOS records its end a
    moment later; one that ends elsewhere is seen within `RESULT_POLL_S`.
    """
    child = handle.get_workflow_id()
    ended = _ended.setdefault(child, asyncio.Event())
    quick = 0
    try:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ended.wait(), RESULT_POLL_S)
            status = await _outside_workflow(handle.get_status())
            if status.status not in ACTIVE_STATUSES:
                break
            if ended.is_set():  # its end is being recorded: ask again soon, for a second
                quick += 1
                if quick >= 200:
                    ended.clear()
                await asyncio.sleep(0.005)
    finally:
        _ended.pop(child, None)
    try:
        return await handle.get_result()
    except dbos_error.DBOSAwaitedWorkflowCancelledError:
        return {"status": "interrupted", "run_id": None, "error": None}


def _say_ended(workflow_id: str) -> None:
    """Wake this process's level waiting for ``workflow_id``, if any."""
    if (ended := _ended.get(workflow_id)) is not None:
        ended.set()


@DBOS.workflow(name=CELL_WORKFLOW)
async def cell_workflow(experiment_id: str, row_id: str, config_index: int, repeat_index: int,
                        thread_id: str, retry_errors: bool, gates: list[str] | None = None,
                        cell_id: str | None = None) -> dict[str, Any]:
    """Run one cell to its end here, or pass it through its next gate (module docstring).

    Args:
        experiment_id: The cell's experiment.
        row_id: Its row.
        config_index: Its configuration.
        repeat_index: Its repeat.
        thread_id: Its thread.
        retry_errors: Whether a cell that ended in an error runs again.
        gates: The model queues this cell still has to pass, in order (none: run it here).
        cell_id: The cell's own workflow ID (None: this workflow is the cell's own).

    Returns:
        The cell's status, run and error as it ended.

    """
    from rubric_core.engine.launch import current_engine

    engine = current_engine()
    if engine is None:  # pragma: no cover - DBOS runs workflows only once launched
        msg = "the queue engine is not launched in this process"
        raise RuntimeError(msg)
    own_id = DBOS.workflow_id or ""
    cell = cell_id or own_id
    if gates:  # pass the next gate: queue the next level on its model's queue, wait for it
        queue = await DBOS.retrieve_queue_async(gates[0])
        if queue is None:
            msg = f"the queue {gates[0]} of a model limit is gone (the experiment ended?)"
            raise RuntimeError(msg)
        level = int(own_id.rpartition("#")[2]) + 1 if cell_id else 1
        with SetWorkflowID(gate_id(cell, level)):
            handle = await queue.enqueue_async(
                cell_workflow, experiment_id, row_id, config_index, repeat_index, thread_id,
                retry_errors, list(gates[1:]), cell)
        result = await _child_result(handle)
        _say_ended(own_id)
        return result
    key = (row_id, int(config_index), int(repeat_index))
    try:
        context = await _context(engine.store, experiment_id)
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        _say_ended(own_id)
        return _lost(experiment_id, CellEnding("interrupted", None, error_text(exc), True))
    stop = _running[cell] = threading.Event()
    _ensure_watcher()
    context.running += 1
    context.idle.clear()
    ending = CellEnding("interrupted", None, None)
    refused = False
    try:

        def stopping() -> bool:
            return stop.is_set() or context.stopping.is_set() or _leaving.is_set()

        # Registered in `_running` above, so a Stop from now on waits for this cell; one that
        # cancelled it before (dequeued just before the cancel, or a level queued just after)
        # is seen here, and the cell starts nothing.
        if not stopping() and await _outside_workflow(_cancelled(cell)):
            stop.set()
        refused = not stopping() and not await admit(engine.store, experiment_id, key, cell)
        if not stopping() and not refused:
            # A cell is one request in flight: grader repeats wait for each other.
            REPEATS_IN_SEQUENCE.set(True)
            ending = await run_cell(
                engine.store, experiment_id=experiment_id, key=key, thread_id=thread_id,
                settings=context.settings_for(key), models=context.models,
                retry_errors=retry_errors, stop=stopping)
    except Exception as exc:
        # A lost database ends the cell where it stands, as a Stop would (no DBOS traceback):
        # a Resume continues it (`rubric_core.engine.outage`). Anything else is a bug.
        if not is_unavailable(exc):
            raise
        refused, ending = False, CellEnding("interrupted", ending.run_id, error_text(exc), True)
    finally:
        _running.pop(cell, None)
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
        context.on_finished(key, ending)
    _say_ended(own_id)
    if ending.lost_database:
        return _lost(experiment_id, ending)
    return {"status": ending.status, "run_id": ending.run_id, "error": ending.error}


def _lost(experiment_id: str, ending: CellEnding) -> dict[str, Any]:
    """The result of a cell cut by a lost database, said to this process's listener."""
    outage.note_cut(experiment_id, ending.error or "")
    return {"status": ending.status, "run_id": ending.run_id, "error": ending.error,
            outage.LOST_KEY: True}


__all__ = ["CANCEL_POLL_S", "CELL_ID_PREFIX", "CELL_WORKFLOW", "GATE_ID_PREFIX", "RESULT_POLL_S",
           "ExperimentContext", "attach", "cell_workflow", "detach", "gate_id", "leave", "rejoin"]
