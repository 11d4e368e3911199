"""Recovery: hand back to their queues the units of engine processes (executors) that stopped.

DBOS recovers at launch only its own executor's workflows, and each process has a new executor
ID, so the units of a process that died stay ``PENDING`` until another hands them back
(`rubric_core.engine._dbos.recover_executors`: idempotent, harmless when repeated or raced).
An executor is gone, judged by the database's clock and what our tables already say:

- holding cells: when no cell it holds has a run with a live heartbeat
  (`rubric_core.session.is_stale`), and it was a process of this machine that has exited
  (`rubric_core.registry.owner_is_gone`) or each of its cells was dequeued more than
  `rubric_core.session.STALE_AFTER_S` ago (a supervised worker keeps its slot's ID across
  restarts: its cells' runs, not its pid, say it lives);
- holding re-grade items: when it has exited (on this machine), or, holding no cell, when
  every re-grade it holds items of was untouched for that long (each process grading one
  touches it) and each of its items was dequeued longer ago than that.

`requeue_orphans` hands back this process's own units that nothing here runs (an outage cut
their start or end). Drivers and workers run both every `SWEEP_S`; ``rubric-studio recover``
once. Details and drills: ``docs/engine.md``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from rubric_core import session
from rubric_core.engine import _dbos
from rubric_core.engine.queues import parse_item_id, thread_of
from rubric_core.engine.runtime import CELL_WORKFLOW, ITEM_WORKFLOW
from rubric_core.registry import owner_is_gone

if TYPE_CHECKING:
    from rubric_core.store import Store

SWEEP_S = max(1.0, session.STALE_AFTER_S / 3)
"""How often a driver or worker looks for stopped executors."""

ORPHAN_AFTER_S = 5.0
"""A workflow of this executor ``PENDING`` this long with nothing here running it is an orphan
(a dequeued workflow starts running here within milliseconds)."""


async def _now_s(store: Store) -> float:
    """The database's clock, which DBOS stamps dequeues with."""
    return datetime.fromisoformat(await store.acall(store.now)).timestamp()


async def stopped_executors(store: Store, *, me: str | None = None) -> list[str]:
    """The executors holding running units that are gone (see the module docstring)."""
    cells: dict[str, list[tuple[int, str]]] = {}  # executor -> (dequeued at, thread) per cell
    items: dict[str, list[tuple[int, str]]] = {}  # executor -> (dequeued at, job) per item
    for workflow in await _dbos.list_workflows(status=_dbos.RUNNING):
        executor = workflow.executor_id
        if not executor or executor == me:
            continue
        parsed = parse_item_id(workflow.workflow_id) if workflow.name == ITEM_WORKFLOW else None
        if parsed is not None:
            items.setdefault(executor, []).append((_dbos.epoch_ms(workflow), parsed[0]))
        elif workflow.name == CELL_WORKFLOW:
            cells.setdefault(executor, []).append(
                (_dbos.epoch_ms(workflow), thread_of(workflow.workflow_id)))
        else:  # not ours: left to the rule of cells (never early)
            cells.setdefault(executor, [])
    if not any(cells.values()) and not items:
        return []
    old_ms = (await _now_s(store) - session.STALE_AFTER_S) * 1000
    gone: list[str] = []
    if any(cells.values()):
        running = await store.acall(store.list_runs, status="running", limit=None)
        live = {r.thread_id for r in running if not session.is_stale(r)}
        gone += [e for e, held in cells.items() if held
                 and not any(thread in live for _, thread in held)
                 and (owner_is_gone(e) or max(at for at, _ in held) < old_ms)]
    rest = [e for e in items if e not in gone and not owner_is_gone(e) and e not in cells]
    gone += [e for e in items if e not in gone and owner_is_gone(e)]
    if rest:
        touched = await store.acall(store.regrade_touched,
                                    sorted({job for e in rest for _, job in items[e]}))
        live_jobs = {job for job, at in touched.items()
                     if at is not None and datetime.fromisoformat(at).timestamp() * 1000 >= old_ms}
        gone += [e for e in rest if not any(job in live_jobs for _, job in items[e])
                 and max(at for at, _ in items[e]) < old_ms]
    return gone


async def recover_stopped_executors(store: Store, *, me: str | None = None) -> dict[str, int]:
    """Re-queue the running units of every stopped executor; how many, per executor."""
    return {executor: await _dbos.recover_executors([executor])
            for executor in await stopped_executors(store, me=me)}


async def requeue_orphans(store: Store, prefixes: list[str], me: str) -> list[str]:
    """Hand back to their queues the workflows this process holds but does not run.

    Of the workflows whose IDs start with one of ``prefixes``: ``PENDING`` on this executor
    for longer than `ORPHAN_AFTER_S` while not running here (the database went away between a
    dequeue and the start, or an end could not be written). One that was running after all is
    refused its end by DBOS. Returns the IDs handed back.
    """
    pending = []
    for prefix in prefixes:
        pending += [w for w in await _dbos.list_workflows(workflow_id_prefix=prefix,
                                                          status=_dbos.RUNNING)
                    if w.executor_id == me]
    if not pending:
        return []
    running = _dbos.running_here()
    now_ms = await _now_s(store) * 1000
    return [w.workflow_id for w in pending if w.workflow_id not in running
            and _dbos.epoch_ms(w) < now_ms - ORPHAN_AFTER_S * 1000
            and await _dbos.requeue_own(w.workflow_id, me)]


__all__ = ["ORPHAN_AFTER_S", "SWEEP_S", "recover_stopped_executors", "requeue_orphans",
           "stopped_executors", "thread_of"]
