"""Recovery: re-queue the cells of engine processes (executors) that stopped.

DBOS recovers, at launch, only the workflows of the launching process's own executor ID, and
each of our processes has a new one (`rubric_core.engine.launch`), so a process that died
(kill -9, a lost machine) would leave its cells ``PENDING`` for ever. This module decides which
executors are gone, from what our own tables already say, and hands their cells back to their
queues (DBOS's ``_recover_pending_workflows``, a private method of 3.4.0: it re-queues a
``PENDING`` workflow only while the dead executor still holds it, so a repeated or racing
recovery is harmless).

An executor is gone when no cell it holds has a run with a live heartbeat on the cell's thread
(`rubric_core.session.is_stale`: a running run's owner touches it every few seconds), and:

- the process named by its ID was a process of this machine that has exited
  (`rubric_core.registry.owner_is_gone`), which is known at once; or
- every cell it holds was dequeued more than `rubric_core.session.STALE_AFTER_S` ago.

Liveness is read from the cells' runs, not from the process named in the executor ID, because
a worker supervised by ``eval --workers`` runs under an ID naming its supervisor, and keeps it
when the supervisor restarts it after a crash (`rubric_core.engine.supervisor`): the restarted
worker's own runs keep its executor alive, so no sweep takes back the cells it has just
recovered (the first rule waits for its supervisor to exit; the second for a cell's run, or a
dequeue younger than `rubric_core.session.STALE_AFTER_S`). The runs themselves keep their own
owners (``host:pid:random`` of the process writing them), so they stay fenced.

A recovered cell runs again on another process through the shared cell body, which continues
the cell's own run once that run's owner is stale: the runs' ownership, not DBOS, keeps a
paused process that wakes up from writing (fenced checkpoints, `rubric_core.store._fence`).
`recover_stopped_executors` is what ``rubric-studio recover`` runs once, and what the driver of
an experiment and every ``rubric-studio worker`` run every `SWEEP_S` seconds.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING

from dbos import DBOS

from rubric_core import session
from rubric_core.engine.cell import CELL_WORKFLOW
from rubric_core.registry import owner_is_gone

if TYPE_CHECKING:
    from rubric_core.store import Store

SWEEP_S = max(1.0, session.STALE_AFTER_S / 3)
"""How often a driver or worker looks for stopped executors."""


async def stopped_executors(store: Store, *, me: str | None = None) -> list[str]:
    """The executors holding running cells that are gone (see the module docstring)."""
    pending = await DBOS.list_workflows_async(status="PENDING", name=CELL_WORKFLOW,
                                              load_input=False, load_output=False)
    held: dict[str, list[tuple[int, str]]] = {}  # executor -> (dequeued at, thread) per cell
    for workflow in pending:
        if workflow.executor_id and workflow.executor_id != me:
            held.setdefault(workflow.executor_id, []).append(
                (workflow.dequeued_at or workflow.updated_at or 0,
                 thread_of(workflow.workflow_id)))
    if not held:
        return []
    running = await store.acall(store.list_runs, status="running", limit=None)
    live_threads = {r.thread_id for r in running if not session.is_stale(r)}
    # DBOS stamps a dequeue with the database's clock: judged by the same clock.
    now = datetime.fromisoformat(await store.acall(store.now)).timestamp()
    old = (now - session.STALE_AFTER_S) * 1000
    return [executor for executor, cells in held.items()
            if not any(thread in live_threads for _, thread in cells)
            and (owner_is_gone(executor) or max(at for at, _ in cells) < old)]


def thread_of(workflow_id: str) -> str:
    """The cell's thread in a cell workflow's ID; "" if not one.

    The ID is `rubric_core.engine.queues.workflow_id`'s: prefix, experiment, configuration,
    repeat, thread, attempt, row (ids are hex: only the row may hold ``:``).
    """
    parts = workflow_id.split(":", 6)
    return parts[4] if len(parts) == 7 else ""


ORPHAN_AFTER_S = 5.0
"""A workflow of this process's executor ``PENDING`` this long with nothing here running it is
an orphan (`requeue_orphans`); a dequeued workflow starts running here within milliseconds."""


async def requeue_orphans(store: Store, prefixes: list[str], me: str) -> list[str]:
    """Hand back to their queues the workflows this process holds but does not run.

    For the workflows whose IDs start with one of ``prefixes`` (an experiment's cells and
    their levels on model queues, a re-grade's items). DBOS marks a workflow ``PENDING`` on
    this process's executor when it dequeues it, then starts it here. Two ways leave it
    ``PENDING`` with nothing running it: the database went away between the dequeue's commit
    and the start (DBOS logs "Error executing workflow" and goes on), or its end could not be
    written (DBOS gives up on a connection error it does not retry). DBOS recovers an
    executor's ``PENDING`` workflows only when it launches under that executor ID again, and
    the sweeps leave this process's own alone (it is alive), so a later session in this
    process (the app's Resume after an outage) waited on them for ever, and as many of them
    as the concurrency left no slot for anything else (seen in `tests/test_regrade_outage.py`).
    Each is queued again on its own queue (DBOS's own re-enqueue of recovery, a private method
    of 3.4.0, which applies only while the workflow is still ``PENDING`` on this executor); one
    that was running after all is refused its end by DBOS (its ownership token changed).
    Returns the IDs handed back.
    """
    from dbos._dbos import _get_dbos_instance
    from dbos._utils import INTERNAL_QUEUE_NAME

    pending = []
    for prefix in prefixes:
        pending += [w for w in await DBOS.list_workflows_async(
            workflow_id_prefix=prefix, status="PENDING", load_input=False, load_output=False)
            if w.executor_id == me]
    if not pending:
        return []
    dbos = _get_dbos_instance()
    running = set(dbos._active_workflows_set.activeList())
    # DBOS stamps a dequeue with the database's clock: judged by that clock.
    now_ms = datetime.fromisoformat(await store.acall(store.now)).timestamp() * 1000
    orphans = [w.workflow_id for w in pending if w.workflow_id not in running
               and (w.dequeued_at or w.updated_at or 0) < now_ms - ORPHAN_AFTER_S * 1000]
    handed = []
    for workflow_id in orphans:
        if await asyncio.to_thread(dbos._sys_db.reenqueue_for_recovery, workflow_id, [me],
                                   INTERNAL_QUEUE_NAME):
            handed.append(workflow_id)
    return handed


async def recover_stopped_executors(store: Store, *, me: str | None = None) -> dict[str, int]:
    """Re-queue the running cells and re-grade items of stopped executors; how many, each.

    Re-grade items have a rule of their own (`rubric_core.engine.regrade_queue`): they have no
    runs whose heartbeats would tell.
    """
    from rubric_core.engine.regrade_queue import recover_stopped_items

    counts: dict[str, int] = {}
    for executor in await stopped_executors(store, me=me):
        handles = await asyncio.to_thread(DBOS._recover_pending_workflows, [executor])
        counts[executor] = len(handles)
    for executor, items in (await recover_stopped_items(store, me=me)).items():
        counts[executor] = counts.get(executor, 0) + items
    return counts


__all__ = ["ORPHAN_AFTER_S", "SWEEP_S", "recover_stopped_executors", "requeue_orphans",
           "stopped_executors", "thread_of"]
