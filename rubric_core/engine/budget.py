"""An experiment's budget on the queue engine: one admission at a time, over every process.

Each process holding back the estimates of its own cells in flight only (the earlier lease
queue's way) would let the cells in flight elsewhere carry the experiment past its budget.
Here a cell, on whichever process dequeued it, starts
only when what the experiment has spent (its recorded calls, priced as `BudgetGuard` prices
them) plus the estimates held by the experiment's cells in flight on ANY process plus its own
estimate stays within the budget kept with the experiment.

- What is in flight is read from the engine: the experiment's ``PENDING`` cell workflows, each
  carrying the estimate it was admitted with as a workflow attribute (`HOLD`, in DBOS's own
  workflow status row). The hold therefore lives exactly as long as the workflow runs: it stops
  counting when the workflow completes (its calls are recorded by then, so they count in what
  was spent), when it is cancelled, or while a dead process's cell waits in the queue again;
  and it counts for a dead or paused process's cell until recovery re-queues it.
- Atomic enough: the admission (read the holds, then what was spent, decide, write this cell's
  hold) runs inside one write transaction of our store holding a lock on the experiment
  (``pg_advisory_xact_lock`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), and the hold is
  committed (DBOS's own transaction) before that lock is released. So admissions of one
  experiment happen one at a time over every process, and each sees every earlier admission's
  hold: two processes cannot both admit the last affordable cell. The holds are read before
  what was spent, so a cell completing in between is counted once or twice, never not at all.
  Within a process admissions also wait for each other (an `asyncio.Lock`), so a process never
  ties up more than one pooled connection waiting for the database lock.
- When a cell does not fit: it ends unstarted (its workflow completes with the attribute
  `REFUSED`, so a Resume queues it again as a new attempt), and under the same lock every
  queued cell of the experiment is cancelled, and so is every dequeued one that was not
  admitted yet (it has no hold; none can be admitted while the lock is held): each finds
  itself cancelled when it asks, and does not start. So no further cell starts anywhere; the
  cells in flight finish. (One exception, never past the budget: a cell resumed after a Stop
  still carries the hold of its earlier start until it asks again, so it is not cancelled and
  is admitted if it fits.) The driver then ends the experiment ``stopped`` with
  ``budget_reached`` (`outcome`), and a Resume (with a larger budget, or the kept one) queues
  the rest again.
- Conservative, never over: a running cell's calls so far count both in what was spent and
  under its hold until it ends. What is spent can pass the budget only by what cells in flight
  spend beyond their estimates, or by the calls a paused worker makes
  after its cell was recovered elsewhere (before the run's fence stops it).
- Cost: an experiment without a budget pays one read of its row per cell; with one, each
  admission reads the experiment's recorded calls (three reads, as `BudgetGuard` does once)
  and its running workflows.

DBOS calls are made outside the cell's workflow context (a fresh `contextvars.Context`), so
they are not recorded as the workflow's steps: a recovered cell asks again rather than replaying
an old answer.
"""

from __future__ import annotations

import asyncio
import contextvars
from decimal import Decimal
from typing import TYPE_CHECKING

from dbos import DBOS

from rubric_core.experiments.budget import Budget, BudgetError, BudgetGuard

if TYPE_CHECKING:
    from collections.abc import Collection
    from typing import Any

    from rubric_core.store import ExperimentRecord, Store

HOLD = "rubric_budget_hold"
"""Workflow attribute: the estimate (US dollars, as text) an admitted cell holds back."""

REFUSED = "rubric_budget_refused"
"""Workflow attribute: set on a cell that did not start because the budget was reached."""

QUEUED = ("ENQUEUED", "DELAYED")
"""Workflow statuses of a cell that waits in its queue (cancelled when the budget is reached)."""

LOCK_PREFIX = "rubric-budget:"
"""The store lock an experiment's admissions take turns on: this prefix and the experiment id."""

_process_locks: dict[str, asyncio.Lock] = {}  # per experiment; touched on the work loop only


async def admit(store: Store, experiment_id: str, key: tuple[str, int, int],
                workflow_id: str) -> bool:
    """Whether this cell may start now under its experiment's budget (see the module docstring).

    Always True for an experiment without a budget. When False the cell must not start.
    """
    experiment = await store.acall(store.get_experiment, experiment_id)
    if experiment is None or experiment.budget is None:
        return True
    # The checkpoint tables exist before the lock is taken: their first creation on PostgreSQL
    # (CREATE INDEX CONCURRENTLY) waits for every open transaction, ours included, while it
    # holds the store's connection lock that our reads need.
    await store.acall(store.saver)
    lock = _process_locks.setdefault(experiment_id, asyncio.Lock())
    async with lock:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, contextvars.Context().run, _admit, store,
                                          experiment, key, workflow_id)


def _admit(store: Store, experiment: ExperimentRecord, key: tuple[str, int, int],
           workflow_id: str) -> bool:
    from rubric_core.engine.queues import id_prefix

    assert experiment.budget is not None
    prefix = id_prefix(experiment.experiment_id)
    # The store's own write transaction, for its lock (held for a few reads and one write).
    with store._connect(write=True) as tx:
        tx.lock(LOCK_PREFIX + experiment.experiment_id)
        running = DBOS.list_workflows(workflow_id_prefix=prefix, status="PENDING",
                                      load_input=False, load_output=False)
        if workflow_id not in {w.workflow_id for w in running}:
            return False  # cancelled meanwhile (Stop, or the budget reached elsewhere)
        held = sum((_held(w.attributes) for w in running if w.workflow_id != workflow_id),
                   Decimal(0))
        try:
            guard = BudgetGuard(store, experiment, Budget.from_dict(experiment.budget))
        except BudgetError:  # a price gone unknown since the experiment started: start nothing
            guard = None
        estimate = Decimal(0) if guard is None else guard.estimate(key[1])
        if guard is not None and guard.spent + held + estimate <= guard.budget.max_usd:
            DBOS.update_workflow_attributes(workflow_id, {HOLD: str(estimate), REFUSED: None},
                                            merge=True)
            return True
        DBOS.update_workflow_attributes(workflow_id, {HOLD: None, REFUSED: True}, merge=True)
        # No further cell starts: the queued cells are cancelled, and so are the dequeued ones
        # not admitted yet (no hold, none refused: none can be admitted while this lock is held).
        queued = DBOS.list_workflows(workflow_id_prefix=prefix, status=list(QUEUED),
                                     load_input=False, load_output=False)
        waiting = [w for w in running if w.workflow_id != workflow_id
                   and (w.attributes or {}).get(HOLD) is None
                   and not (w.attributes or {}).get(REFUSED)]
        if queued or waiting:
            # With their levels on model queues (`rubric_core.engine.queues.routes`).
            DBOS.cancel_workflows([w.workflow_id for w in (*queued, *waiting)],
                                  cancel_children=True)
        return False


def _held(attributes: dict[str, Any] | None) -> Decimal:
    value = (attributes or {}).get(HOLD)
    return Decimal(str(value)) if value is not None else Decimal(0)


async def outcome(store: Store, experiment: ExperimentRecord, budget: Budget,
                  workflow_ids: Collection[str]) -> tuple[bool, Decimal]:
    """Whether one of ``workflow_ids`` (a session's cells) was refused, and what was spent."""
    from rubric_core.engine.queues import id_prefix

    found = await DBOS.list_workflows_async(
        workflow_id_prefix=id_prefix(experiment.experiment_id), load_input=False,
        load_output=False)
    ids = set(workflow_ids)
    reached = any(w.workflow_id in ids and (w.attributes or {}).get(REFUSED) for w in found)
    guard = await store.acall(BudgetGuard, store, experiment, budget)
    return reached, guard.spent


__all__ = ["HOLD", "LOCK_PREFIX", "QUEUED", "REFUSED", "admit", "outcome"]
