"""The one workflow runtime: cells and re-grade items as DBOS workflows, on whichever process.

Both kinds run the same way (`_run`): a unit dequeued here finds its batch (the driver's,
`attach`, else one its body loads), is registered in the engine so that Stop reaches it, runs
its body (`rubric_core.engine.body.Body`) as a task outside the workflow's context (DBOS would
record its calls as steps), and ends. Stop: the engine watches the units it runs (one query
every `CANCEL_POLL_S`) and halts a cancelled one: its ``stop`` is set and, for a body that
``cancels_in_flight``, its task cancelled. A process that leaves (`leave`: a worker stopped)
halts its units and leaves their workflows ``PENDING`` for recovery (`park`).

A cell under model limits passes through levels first: its workflow enqueues itself as a child
on the first model's queue with the rest of its ``gates``, and so on; the innermost runs the
body; each level waits for its child's result (`gate_id`, `_child_result`). Why and what it
costs: ``docs/engine.md``.

The two workflows' registered names and inputs are stored with every queued unit: never change
them (`CELL_WORKFLOW`, `ITEM_WORKFLOW`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

from rubric_core.engine import _dbos
from rubric_core.engine.body import CELL, ITEM, Unit, body_of
from rubric_core.session import HEARTBEAT_S

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from rubric_core.engine.body import Batch
    from rubric_core.engine.wake import Wakeable
    from rubric_core.store import Store

T = TypeVar("T")

CELL_WORKFLOW = "rubric_studio.cell"
"""The cell workflow's registered name."""
ITEM_WORKFLOW = "rubric_studio.regrade_item"
"""The re-grade item workflow's registered name."""

CELL_ID_PREFIX = "rubric-cell:"
"""What a cell's own workflow ID starts with."""
GATE_ID_PREFIX = "rubric-gate:"
"""What the ID of a cell's level on a model queue starts with (`gate_id`)."""
ITEM_ID_PREFIX = "rubric-item:"
"""What an item's workflow ID starts with."""

CANCEL_POLL_S = 0.5
"""How often a process asks whether the units it runs were cancelled (Stop)."""

RESULT_POLL_S = 0.2
"""How often a level asks whether its child, running in another process, ended (a child in this
process wakes it at once)."""


@dataclasses.dataclass(eq=False)
class Engine:
    """The engine as launched in this process, and all it keeps here."""

    location: str
    """The store's database it serves (a SQLite path or a URL with its password: never shown)."""
    store: Store
    """The store the engine was launched with, which the units write through."""
    executor_id: str
    """This process's DBOS executor ID."""
    listening: list[str] | None
    """The queues this process takes units from; None: every queue (a worker)."""
    batches: dict[tuple[str, str], Batch] = dataclasses.field(default_factory=dict)
    """``(kind, batch id)`` -> the batch its units here use (this module)."""
    running: dict[str, Unit] = dataclasses.field(default_factory=dict)
    """Unit ID -> the unit running here."""
    ended: dict[str, asyncio.Event] = dataclasses.field(default_factory=dict)
    """A level's child's workflow ID -> set when it ended here."""
    cancelled: set[str] = dataclasses.field(default_factory=set)
    """Workflows this process cancelled (`note_cancelled`)."""
    leaving: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set when this process stops taking part (`leave`)."""
    watcher: asyncio.Task[None] | None = None
    """The task watching the running units' cancellations."""
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
    """Queue -> its global concurrency as registered (`rubric_core.engine.queues`), for wakes."""
    wakeable: Wakeable | None = None
    """What DBOS's queue threads sleep on here (`rubric_core.engine.wake`); None: DBOS's own."""
    admissions: dict[str, asyncio.Lock] = dataclasses.field(default_factory=dict)
    """Per batch: the lock its admissions here take in turn (`rubric_core.engine.holds`)."""
    holds: int = 0
    """Open `engine_for` holds (batches this process drives now)."""


LOCK = threading.RLock()
"""Held while the engine is launched or stopped (`rubric_core.engine.launch`)."""
LAUNCHED: list[Engine] = []
"""The one engine of this process, while launched (`rubric_core.engine.launch`)."""


def current_engine() -> Engine | None:
    """The engine launched in this process, if any."""
    with LOCK:
        return LAUNCHED[0] if LAUNCHED else None


def engine() -> Engine:
    """The engine launched in this process (DBOS runs workflows only once launched)."""
    found = current_engine()
    if found is None:  # pragma: no cover - DBOS runs workflows only once launched
        msg = "the queue engine is not launched in this process"
        raise RuntimeError(msg)
    return found


def gate_id(cell_id: str, level: int) -> str:
    """The ID of a cell's level ``level`` (1: the first model's queue); unique by its thread."""
    return GATE_ID_PREFIX + cell_id.removeprefix(CELL_ID_PREFIX) + f"#{level}"


def attach(eng: Engine, kind: str, batch: Batch) -> None:
    """Make ``batch`` the one this process's units of it use (a driver's)."""
    batch.idle.set()
    eng.batches[(kind, batch.batch_id)] = batch


def detach(eng: Engine, kind: str, batch: Batch) -> None:
    """Forget ``batch`` (its driver ended); later units here load one."""
    if eng.batches.get((kind, batch.batch_id)) is batch:
        del eng.batches[(kind, batch.batch_id)]


def stop_batch(eng: Engine, kind: str, batch_id: str) -> int:
    """Stop here: halt the batch's units running here, and start none of it; how many halted."""
    if (batch := eng.batches.get((kind, batch_id))) is not None:
        batch.stopping.set()
    halted = [u for u in eng.running.values()
              if u.kind == kind and u.batch.batch_id == batch_id and not u.stop.is_set()]
    for unit in halted:
        _halt(unit)
    return len(halted)


def note_cancelled(eng: Engine, workflow_ids: list[str]) -> None:
    """Remember units this process cancels: one dequeued here just before stops at once."""
    eng.cancelled.update(workflow_ids)


async def leave(eng: Engine, timeout_s: float = 30.0) -> int:
    """Halt every unit here and leave its workflow for recovery; how many still ran at timeout.

    Units dequeued from now on start nothing.
    """
    eng.leaving.set()
    for unit in list(eng.running.values()):
        _halt(unit)
    deadline = time.monotonic() + timeout_s
    while eng.running and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return len(eng.running)


async def park(eng: Engine) -> None:
    """Never return while this process leaves: the workflow stays ``PENDING`` here."""
    if eng.leaving.is_set():
        await asyncio.Event().wait()


def _halt(unit: Unit) -> None:
    unit.stop.set()
    if unit.task is not None and body_of(unit.kind).halted is not None:
        unit.task.cancel()


async def outside_workflow(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` outside the calling workflow: DBOS would record its calls as steps."""
    loop = asyncio.get_running_loop()
    return await contextvars.Context().run(loop.create_task, coro)


async def is_cancelled(workflow_id: str) -> bool:
    """Whether ``workflow_id`` was cancelled (a Stop), asked outside any workflow."""
    return bool(await outside_workflow(_dbos.list_workflows(
        workflow_ids=[workflow_id], status=_dbos.CANCELLED)))


async def _watch(eng: Engine) -> None:
    """Halt the units here whose workflow was cancelled; keep their batches' heartbeats."""
    beaten: dict[tuple[str, str], float] = {}
    while eng.running:
        await asyncio.sleep(CANCEL_POLL_S)
        ids = list(eng.running)
        if not ids:
            break
        with contextlib.suppress(Exception):  # a busy database: the next round asks again
            for found in await _dbos.list_workflows(workflow_ids=ids, status=_dbos.CANCELLED):
                if (unit := eng.running.get(found.workflow_id)) is not None:
                    _halt(unit)
        now = time.monotonic()
        for key in {(u.kind, u.batch.batch_id) for u in eng.running.values()}:
            if now - beaten.get(key, 0.0) >= HEARTBEAT_S:
                beaten[key] = now
                with contextlib.suppress(Exception):  # the next round beats again
                    await body_of(key[0]).beat(eng.store, key[1])
    eng.watcher = None


async def _batch(eng: Engine, kind: str, batch_id: str) -> Batch:
    batch = eng.batches.get((kind, batch_id))
    if batch is None:
        loaded = await body_of(kind).load(eng.store, batch_id)
        batch = eng.batches.setdefault((kind, batch_id), loaded)
        batch.idle.set()
    return batch


async def _run(kind: str, batch_id: str, args: tuple[Any, ...], parent: str | None
               ) -> dict[str, Any]:
    """A unit's workflow body, for either kind (see the module docstring)."""
    eng = engine()
    own = _dbos.current_workflow_id()
    await park(eng)
    body = body_of(kind)
    try:
        batch = await _batch(eng, kind, batch_id)
    except Exception as exc:  # a lost database: the body says what the workflow returns
        lost = body.lost(batch_id, exc)
        if lost is None:
            raise
        _say_ended(eng, own)
        return lost
    unit = Unit(kind=kind, workflow_id=own, unit_id=parent or own, parent=parent, batch=batch,
                args=args, store=eng.store, leaving=eng.leaving)
    if own in eng.cancelled:  # dequeued just before this process's Stop cancelled it
        eng.cancelled.discard(own)
        unit.stop.set()
    loop = asyncio.get_running_loop()
    eng.running[unit.unit_id] = unit
    if eng.watcher is None or eng.watcher.done():
        eng.watcher = contextvars.Context().run(loop.create_task, _watch(eng))
    batch.running += 1
    batch.idle.clear()
    failure: BaseException | None = None
    task: asyncio.Task[dict[str, Any]] | None = None
    try:
        # Registered: a Stop from now on waits for this unit. One that cancelled it before
        # (on any process: dequeued just before the cancel landed, or a level queued just
        # after) is seen here, and the unit starts nothing.
        if not unit.stop.is_set() and await is_cancelled(unit.unit_id):
            unit.stop.set()
        # An empty context: the body is no step of this workflow.
        task = unit.task = contextvars.Context().run(loop.create_task, body.run(unit))
        result = await asyncio.shield(task)
    except asyncio.CancelledError:
        if task is None or body.halted is None or not unit.stop.is_set():
            if task is not None:  # the workflow itself was cancelled
                task.cancel()
            raise
        result = dict(body.halted)
    except Exception as exc:  # a lost database: said to the batch, raised to DBOS
        failure = exc
    finally:
        eng.running.pop(unit.unit_id, None)
        batch.running -= 1
        if batch.running == 0:
            batch.idle.set()
    if failure is not None:
        batch.failed(failure)
        raise failure
    if not unit.unstarted:
        await park(eng)
    _say_ended(eng, own)
    return result


def _say_ended(eng: Engine, workflow_id: str) -> None:
    """Wake this process's level waiting for ``workflow_id``, if any."""
    if (ended := eng.ended.get(workflow_id)) is not None:
        ended.set()


async def _child_result(eng: Engine, handle: Any) -> dict[str, Any]:
    """A level's child's result; a child cancelled (Stop): its cell interrupted.

    A child that ends here says so at once (`Engine.ended`), and DBOS records its end a moment
    later; one that ends elsewhere is seen within `RESULT_POLL_S`.
    """
    child = handle.get_workflow_id()
    ended = eng.ended.setdefault(child, asyncio.Event())
    quick = 0
    try:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ended.wait(), RESULT_POLL_S)
            status = await outside_workflow(handle.get_status())
            if status.status not in _dbos.ACTIVE:
                break
            if ended.is_set():  # its end is being recorded: ask again soon, for a second
                quick += 1
                if quick >= 200:
                    ended.clear()
                await asyncio.sleep(0.005)
    finally:
        eng.ended.pop(child, None)
    try:
        return await handle.get_result()
    except _dbos.AwaitedCancelled:
        return {"status": "interrupted", "run_id": None, "error": None}


@_dbos.workflow(name=CELL_WORKFLOW)
async def cell_workflow(experiment_id: str, row_id: str, config_index: int, repeat_index: int,
                        thread_id: str, retry_errors: bool, gates: list[str] | None = None,
                        cell_id: str | None = None) -> dict[str, Any]:
    """One experiment cell: run it here, or pass it through its next model queue (``gates``).

    ``cell_id``: the cell's own workflow ID when this workflow is one of its levels.
    Returns the cell's status, run and error as it ended.
    """
    if not gates:
        return await _run(CELL, experiment_id, (row_id, config_index, repeat_index, thread_id,
                                                retry_errors), cell_id)
    eng = engine()
    own = _dbos.current_workflow_id()
    cell = cell_id or own
    level = int(own.rpartition("#")[2]) + 1 if cell_id else 1
    queue = await _dbos.queue(gates[0], "a model limit (the experiment ended?)")
    handle = await _dbos.enqueue(queue, cell_workflow, experiment_id, row_id, config_index,
                                 repeat_index, thread_id, retry_errors, list(gates[1:]), cell,
                                 workflow_id=gate_id(cell, level))
    result = await _child_result(eng, handle)
    _say_ended(eng, own)
    return result


@_dbos.workflow(name=ITEM_WORKFLOW)
async def item_workflow(job_id: str, config_index: int, item_id: str) -> dict[str, Any]:
    """One re-grade item: an answer's repeats under one configuration, graded here.

    Returns ``graded`` (gradings made here) and ``stopped`` (cancelled before the last).
    """
    return await _run(ITEM, job_id, (config_index, item_id), None)


__all__ = [
    "CANCEL_POLL_S",
    "CELL_ID_PREFIX",
    "CELL_WORKFLOW",
    "GATE_ID_PREFIX",
    "ITEM_ID_PREFIX",
    "ITEM_WORKFLOW",
    "LAUNCHED",
    "LOCK",
    "RESULT_POLL_S",
    "Engine",
    "attach",
    "cell_workflow",
    "current_engine",
    "detach",
    "engine",
    "gate_id",
    "is_cancelled",
    "item_workflow",
    "leave",
    "note_cancelled",
    "outside_workflow",
    "park",
    "stop_batch",
]
