"""An experiment's queue and its cells' workflow IDs: enqueue (idempotent), Stop, clean-up.

One DBOS queue per experiment (`queue_name`), whose global concurrency is the experiment's
concurrency over every process, with an optional rate limit (cells started per period). Every
process with the engine launched polls every queue of the application (DBOS keeps them in its
tables), so a ``rubric-studio worker`` needs to be told nothing about an experiment.

A cell's workflow ID is deterministic (`workflow_id`): experiment, configuration, repeat, the
cell's thread, an attempt number and the row. Enqueuing an ID that exists is a no-op in DBOS,
so two Resumes (or a Resume racing a worker) never queue a cell twice. The attempt number is
what lets a cell run again after its workflow has completed without ending the cell (its run
was interrupted by a lost database, or ended ``error`` and errors are retried): the next
enqueue uses the next attempt, which every racing enqueuer computes alike. A cancelled
workflow (Stop) is resumed under its own ID, on its experiment's queue (without the queue name
DBOS would put it on its internal queue, which has no limit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dbos import DBOS, SetWorkflowID

from rubric_core.engine.cell import cell_workflow

if TYPE_CHECKING:
    from collections.abc import Iterable

QUEUE_PREFIX = "rubric-exp-"
"""Queue names: this prefix and the experiment id."""

POLL_S = 0.1
"""How often each process polls an experiment's queue (DBOS's own loop; ~5% of a core per
queue per process while the queue exists)."""

ACTIVE = ("ENQUEUED", "PENDING", "DELAYED")
"""Workflow statuses of a cell that is queued or running."""

RESUMABLE = "CANCELLED"
"""The status of a stopped cell's workflow: resumed under its own ID."""


def queue_name(experiment_id: str) -> str:
    """The name of an experiment's queue."""
    return QUEUE_PREFIX + experiment_id


def id_prefix(experiment_id: str) -> str:
    """What every workflow ID of an experiment's cells starts with."""
    return f"rubric-cell:{experiment_id}:"


def workflow_id(experiment_id: str, key: tuple[str, int, int], thread_id: str,
                attempt: int) -> str:
    """A cell's workflow ID (see the module docstring); the row id last (it may hold ``:``)."""
    row_id, config_index, repeat_index = key
    return (f"{id_prefix(experiment_id)}{config_index}:{repeat_index}:{thread_id}:{attempt}:"
            f"{row_id}")


def attempt_of(workflow: str, experiment_id: str) -> tuple[str, int] | None:
    """``(the ID without its attempt, attempt)`` of one of the experiment's workflow IDs."""
    rest = workflow[len(id_prefix(experiment_id)):]
    parts = rest.split(":", 4)
    if len(parts) != 5 or not parts[3].isdigit():
        return None
    config_index, repeat_index, thread_id, attempt, row_id = parts
    return f"{config_index}:{repeat_index}:{thread_id}:{row_id}", int(attempt)


async def register_queue(experiment_id: str, *, concurrency: int,
                         rate_limit: tuple[int, float] | None = None) -> None:
    """Create (or update) an experiment's queue with its limits.

    Args:
        experiment_id: The experiment.
        concurrency: Cells at once over every process.
        rate_limit: At most ``limit`` cells started per ``period`` seconds, over every
            process; None for none.

    """
    limiter: Any = None if rate_limit is None else {"limit": rate_limit[0],
                                                     "period": rate_limit[1]}
    await DBOS.register_queue_async(queue_name(experiment_id), global_concurrency=concurrency,
                                    limiter=limiter, polling_interval_sec=POLL_S,
                                    on_conflict="always_update")


async def delete_queue(experiment_id: str) -> None:
    """Remove an experiment's queue (no process polls it any more)."""
    await DBOS.delete_queue_async(queue_name(experiment_id))


async def enqueue_cells(experiment_id: str, cells: Iterable[tuple[tuple[str, int, int], str]],
                        *, retry_errors: bool) -> dict[str, tuple[str, int, int]]:
    """Queue the given cells (``(key, thread id)``) on the experiment's queue, idempotently.

    A cell whose latest workflow is queued or running is left as it is; a cancelled one is
    resumed; one whose workflow completed gets its next attempt; a cell never queued, its
    first. The queue must exist (`register_queue`).

    Returns:
        Each cell's current workflow ID, with its key.

    """
    existing = await DBOS.list_workflows_async(
        workflow_id_prefix=id_prefix(experiment_id), load_input=False, load_output=False)
    latest: dict[str, tuple[int, str, str]] = {}  # cell -> (attempt, workflow id, status)
    for workflow in existing:
        parsed = attempt_of(workflow.workflow_id, experiment_id)
        if parsed is not None and parsed[1] >= latest.get(parsed[0], (0, "", ""))[0]:
            latest[parsed[0]] = (parsed[1], workflow.workflow_id, workflow.status)
    queue = await DBOS.retrieve_queue_async(queue_name(experiment_id))
    if queue is None:
        msg = f"experiment {experiment_id} has no queue: register it first"
        raise KeyError(msg)
    ids: dict[str, tuple[str, int, int]] = {}
    resume: list[str] = []
    for key, thread_id in cells:
        cell = f"{key[1]}:{key[2]}:{thread_id}:{key[0]}"
        attempt, found, status = latest.get(cell, (0, "", ""))
        if status in ACTIVE:
            ids[found] = key
            continue
        if status == RESUMABLE:
            resume.append(found)
            ids[found] = key
            continue
        wid = workflow_id(experiment_id, key, thread_id, attempt + 1)
        with SetWorkflowID(wid):
            await queue.enqueue_async(cell_workflow, experiment_id, key[0], key[1], key[2],
                                      thread_id, retry_errors)
        ids[wid] = key
    if resume:
        await DBOS.resume_workflows_async(resume, queue_name=queue_name(experiment_id))
    return ids


async def active_workflows(experiment_id: str) -> list[str]:
    """The experiment's cell workflows queued or running now, on any process."""
    found = await DBOS.list_workflows_async(
        workflow_id_prefix=id_prefix(experiment_id), status=list(ACTIVE), load_input=False,
        load_output=False)
    return [w.workflow_id for w in found]


async def cancel_cells(experiment_id: str) -> int:
    """Stop: cancel every queued or running cell workflow of the experiment; how many.

    Queued cells will not start; running ones are stopped by their process within
    `rubric_core.engine.cell.CANCEL_POLL_S` and end after their step.
    """
    ids = await active_workflows(experiment_id)
    if ids:
        await DBOS.cancel_workflows_async(ids)
    return len(ids)


__all__ = ["ACTIVE", "POLL_S", "QUEUE_PREFIX", "active_workflows", "attempt_of", "cancel_cells",
           "delete_queue", "enqueue_cells", "id_prefix", "queue_name", "register_queue",
           "workflow_id"]
