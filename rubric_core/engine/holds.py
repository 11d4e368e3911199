"""Admission under a shared allowance, one at a time over every process (an experiment's budget).

A unit, on whichever process dequeued it, starts only when the policy's ``fits`` (called with
what each of the batch's other units in flight holds, on any process) returns the amount it
will hold.
Each admitted unit's hold is a workflow attribute (`HOLD`, in DBOS's own status row), so it
lives exactly as long as its workflow runs. An admission runs inside one write transaction of
our store holding a lock named by the policy, and writes its hold before that lock is released:
admissions of one batch happen one at a time over every process, each seeing every earlier
hold. Within a process they also wait for each other (`Engine.admissions`), so a process never
ties up more than one pooled connection waiting for the lock. A unit refused ends unstarted
(`REFUSED` set), and under the same lock every queued unit of the batch, and every dequeued
one not admitted yet, is cancelled (with its levels), so none starts anywhere. Why it cannot
overspend, and what it costs: ``docs/engine.md``.
"""

from __future__ import annotations

import asyncio
import contextvars
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rubric_core.engine import _dbos
from rubric_core.engine.runtime import engine

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping

    from rubric_core.store import Store

HOLD = "rubric_budget_hold"
"""Workflow attribute: the amount (US dollars, as text) an admitted unit holds back."""

REFUSED = "rubric_budget_refused"
"""Workflow attribute: set on a unit that did not start because it did not fit."""


async def admit(store: Store, prefix: str, workflow_id: str, lock: str,
                fits: Callable[[Mapping[str, Decimal]], Decimal | None]) -> bool:
    """Whether ``workflow_id`` may start (see the module docstring); False: it must not.

    Args:
        store: The database whose lock serialises admissions.
        prefix: The batch's workflow ID prefix (its units in flight are read by it).
        workflow_id: The unit's own workflow.
        lock: The store lock admissions of the batch take in turn.
        fits: Given what each other admitted unit holds (by workflow ID), the amount this
            unit holds if it fits, else None (called on a thread, inside the transaction).

    """
    turn = engine().admissions.setdefault(lock, asyncio.Lock())
    async with turn:
        loop = asyncio.get_running_loop()
        # Outside the workflow's context: DBOS must not record these calls as its steps.
        return await loop.run_in_executor(None, contextvars.Context().run, _admit, store,
                                          prefix, workflow_id, lock, fits)


def _admit(store: Store, prefix: str, workflow_id: str, lock: str,
           fits: Callable[[Mapping[str, Decimal]], Decimal | None]) -> bool:
    with store._connect(write=True) as tx:  # the store's own transaction, for its lock
        tx.lock(lock)
        running = _dbos.list_workflows_sync(workflow_id_prefix=prefix, status=_dbos.RUNNING)
        if workflow_id not in {w.workflow_id for w in running}:
            return False  # cancelled meanwhile (Stop, or refused elsewhere)
        held = {w.workflow_id: _held(w.attributes) for w in running
                if w.workflow_id != workflow_id and (w.attributes or {}).get(HOLD) is not None}
        amount = fits(held)
        if amount is not None:
            _dbos.set_attributes(workflow_id, {HOLD: str(amount), REFUSED: None})
            return True
        _dbos.set_attributes(workflow_id, {HOLD: None, REFUSED: True})
        queued = _dbos.list_workflows_sync(workflow_id_prefix=prefix, status=list(_dbos.QUEUED))
        waiting = [w for w in running if w.workflow_id != workflow_id
                   and (w.attributes or {}).get(HOLD) is None
                   and not (w.attributes or {}).get(REFUSED)]
        _dbos.cancel_sync([w.workflow_id for w in (*queued, *waiting)], children=True)
        return False


def _held(attributes: dict[str, Any] | None) -> Decimal:
    value = (attributes or {}).get(HOLD)
    return Decimal(str(value)) if value is not None else Decimal(0)


async def refused(prefix: str, workflow_ids: Collection[str]) -> bool:
    """Whether one of ``workflow_ids`` (a session's units) was refused."""
    ids = set(workflow_ids)
    return any(w.workflow_id in ids and (w.attributes or {}).get(REFUSED)
               for w in await _dbos.list_workflows(workflow_id_prefix=prefix))


__all__ = ["HOLD", "REFUSED", "admit", "refused"]
