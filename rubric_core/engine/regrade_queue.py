"""A re-grade's queue and its items' workflow IDs: enqueue (idempotent), Stop, recovery.

One DBOS queue per re-grade (`queue_name`), whose global concurrency is the re-grade's
``concurrency`` over every process: an item is one request in flight
(`rubric_core.engine.item`), so that is the number of requests in flight. Every process with
the engine launched for every queue (``rubric-studio worker``) takes items from it; a process
driving a re-grade takes them from its own re-grade's queue (`rubric_core.engine.launch.listen`).
A second driver of the same re-grade registers the queue again with its own concurrency (the
latest registration's limit holds).

An item's workflow ID is deterministic (`workflow_id`): re-grade, configuration, an attempt
number, answer. Enqueuing an ID that exists is a no-op in DBOS, so two Resumes (or a Resume
racing a second driver) never queue an item twice. The attempt number lets an item run again
after its workflow ended without recording all its gradings (Stop cancelled it; a retry of
errors forgot some; a lost database ended it): the next enqueue uses the next attempt, which
every racing enqueuer computes alike.

Recovery (`recover_stopped_items`, run by drivers and workers every
`rubric_core.engine.recovery.SWEEP_S`, and by ``rubric-studio recover``): DBOS recovers at launch
only its own executor's workflows, so the items a dead process held stay ``PENDING`` until
another process hands them back to their queue (DBOS's ``_recover_pending_workflows``, a private
method of 3.4.0, which re-queues a workflow only while the dead executor still holds it). An
executor is gone when it was a process of this machine that has exited
(`rubric_core.registry.owner_is_gone`, known at once), or when every re-grade it holds items of
was untouched for `rubric_core.session.STALE_AFTER_S` (every process grading a re-grade touches
it every `rubric_core.session.HEARTBEAT_S`) and each of its items was dequeued longer ago than
that. The price of the second rule: a process of another machine that died while others still
grade the same re-grade has its items handed back only once they are done. Never early: a live
process's slow grading is not graded twice.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dbos import DBOS

from rubric_core.engine import wake
from rubric_core.engine.item import ITEM_ID_PREFIX, ITEM_WORKFLOW, item_workflow, note_cancelled

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rubric_core.store import Store

QUEUE_PREFIX = "rubric-regrade-"
"""Queue names: this prefix and the re-grade's id."""

POLL_S = 0.1
"""How often each process polls a re-grade's queue (DBOS's own loop)."""

ACTIVE = ("ENQUEUED", "PENDING", "DELAYED")
"""DBOS statuses of an item that has not ended."""


def queue_name(job_id: str) -> str:
    """The name of a re-grade's queue."""
    return QUEUE_PREFIX + job_id


def id_prefix(job_id: str) -> str:
    """What every workflow ID of a re-grade's items starts with."""
    return f"{ITEM_ID_PREFIX}{job_id}:"


def workflow_id(job_id: str, config_index: int, item_id: str, attempt: int) -> str:
    """An item's workflow ID (module docstring); the answer's id last (it may hold ``:``)."""
    return f"{id_prefix(job_id)}{config_index}:{attempt}:{item_id}"


def parse_id(workflow: str) -> tuple[str, int, int, str] | None:
    """``(job, configuration, attempt, answer)`` of an item's workflow ID; None if not one."""
    if not workflow.startswith(ITEM_ID_PREFIX):
        return None
    parts = workflow[len(ITEM_ID_PREFIX):].split(":", 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], int(parts[1]), int(parts[2]), parts[3]


async def register_queue(job_id: str, *, concurrency: int) -> str:
    """Create (or update) a re-grade's queue with its limit over every process; its name."""
    name = queue_name(job_id)
    await wake.register_queue(name, concurrency=concurrency, polling_interval_sec=POLL_S)
    return name


async def delete_queue(job_id: str) -> None:
    """Remove a re-grade's queue (no process polls it any more)."""
    await wake.delete_queue(queue_name(job_id))


async def latest_attempts(job_id: str) -> dict[tuple[int, str], tuple[int, str]]:
    """Per item ``(configuration, answer)``: its latest attempt and that workflow's status."""
    found = await DBOS.list_workflows_async(workflow_id_prefix=id_prefix(job_id),
                                            load_input=False, load_output=False)
    latest: dict[tuple[int, str], tuple[int, str]] = {}
    for workflow in found:
        parsed = parse_id(workflow.workflow_id)
        if parsed is None or parsed[0] != job_id:
            continue
        key = (parsed[1], parsed[3])
        if parsed[2] >= latest.get(key, (0, ""))[0]:
            latest[key] = (parsed[2], workflow.status)
    return latest


async def enqueue_items(job_id: str, items: Iterable[tuple[int, str]],
                        latest: dict[tuple[int, str], tuple[int, str]]) -> int:
    """Queue the given items on the re-grade's queue, idempotently; how many were queued.

    An item whose latest workflow is queued or running is left as it is; one whose workflow
    ended gets its next attempt; one never queued, its first. ``latest`` (`latest_attempts`) is
    updated with what was queued. The queue must exist (`register_queue`).
    """
    queue = await DBOS.retrieve_queue_async(queue_name(job_id))
    if queue is None:
        msg = f"re-grade {job_id} has no queue: register it first"
        raise KeyError(msg)
    queued = 0
    for key in items:
        attempt, status = latest.get(key, (0, ""))
        if status in ACTIVE:
            continue
        attempt += 1
        from dbos import SetWorkflowID

        with SetWorkflowID(workflow_id(job_id, key[0], key[1], attempt)):
            await queue.enqueue_async(item_workflow, job_id, key[0], key[1])
        latest[key] = (attempt, "ENQUEUED")
        queued += 1
    return queued


async def active_items(job_id: str) -> list[Any]:
    """The re-grade's item workflows queued or running now, on any process."""
    return list(await DBOS.list_workflows_async(
        workflow_id_prefix=id_prefix(job_id), status=list(ACTIVE), load_input=False,
        load_output=False))


async def cancel_items(job_id: str) -> int:
    """Stop: cancel every queued or running item of the re-grade; how many.

    Queued items will not start; running ones have their grading in flight cancelled by their
    process within `rubric_core.engine.item.CANCEL_POLL_S` (nothing of it recorded).
    """
    ids = [w.workflow_id for w in await active_items(job_id)]
    if ids:
        note_cancelled(ids)  # one dequeued here before the cancel lands grades nothing
        await DBOS.cancel_workflows_async(ids)
    return len(ids)


async def stopped_item_executors(store: Store, *, me: str | None = None) -> list[str]:
    """The executors holding running items that are gone (see the module docstring)."""
    from rubric_core import session
    from rubric_core.registry import owner_is_gone

    pending = await DBOS.list_workflows_async(status="PENDING", load_input=False,
                                              load_output=False)
    held: dict[str, list[tuple[int, str]]] = {}  # executor -> (dequeued at, job) per item
    with_cells: set[str] = set()  # judged by the cells' rule (`rubric_core.engine.recovery`)
    for workflow in pending:
        parsed = parse_id(workflow.workflow_id) if workflow.name == ITEM_WORKFLOW else None
        if not workflow.executor_id or workflow.executor_id == me:
            continue
        if parsed is None:
            with_cells.add(workflow.executor_id)
            continue
        held.setdefault(workflow.executor_id, []).append(
            (workflow.dequeued_at or workflow.updated_at or 0, parsed[0]))
    if not held:
        return []
    # Recovery hands back every workflow of an executor: one that holds cells too is left to
    # the cells' rule, unless it is known gone.
    gone = [e for e in held if owner_is_gone(e)]
    rest = [e for e in held if e not in gone and e not in with_cells]
    if rest:
        # DBOS stamps a dequeue with the database's clock; our rows too: judged by that clock.
        now = datetime.fromisoformat(await store.acall(store.now)).timestamp()
        old = now - session.STALE_AFTER_S
        jobs = {job for e in rest for _, job in held[e]}
        touched = await store.acall(store.regrade_touched, sorted(jobs))
        live = {job for job, at in touched.items()
                if at is not None and datetime.fromisoformat(at).timestamp() >= old}
        gone += [e for e in rest if not any(job in live for _, job in held[e])
                 and max(at for at, _ in held[e]) < old * 1000]
    return gone


async def recover_stopped_items(store: Store, *, me: str | None = None) -> dict[str, int]:
    """Re-queue the running items of every stopped executor; how many, per executor."""
    counts: dict[str, int] = {}
    for executor in await stopped_item_executors(store, me=me):
        handles = await asyncio.to_thread(DBOS._recover_pending_workflows, [executor])
        counts[executor] = len(handles)
    return counts


__all__ = ["ACTIVE", "POLL_S", "QUEUE_PREFIX", "active_items", "cancel_items",
           "delete_queue", "enqueue_items", "id_prefix", "latest_attempts", "parse_id",
           "queue_name", "recover_stopped_items", "register_queue", "stopped_item_executors",
           "workflow_id"]
