"""An experiment's queues and its cells' workflow IDs: enqueue (idempotent), Stop, clean-up.

One DBOS queue per experiment (`queue_name`), whose global concurrency is the experiment's
concurrency over every process, with an optional rate limit (cells started per period). Every
process with the engine launched polls every queue of the application (DBOS keeps them in its
tables), so a ``rubric-studio worker`` needs to be told nothing about an experiment.

Per-model limits (`ModelLimit`: cells at once using a model, cells using it started per
period, any process) are DBOS's too, not a limiter of ours, in one of two ways (`routes`):

- Partitions, when every configuration uses exactly one limited model and those models share
  their limits (the common case: one model everywhere, or a limited worker graded by
  ``rules``): each cell is queued on the experiment's queue with its model as partition key,
  and the queue's partition concurrency and partition rate limit are the model's. DBOS checks
  the experiment's limit and the model's in the same dequeue: nothing is added to a cell's
  way (measured: `bench/engine_limits.py`, span efficiency as without model limits).
- Otherwise (a cell using two limited models, or models with different limits: DBOS gives a
  workflow one partition key, and a queue one limit for all its partitions) a queue per
  experiment and limited model (`model_queue_name`), with the model's limits as its global
  concurrency and rate limit. A cell passes those queues nested in its own workflow, in sorted
  order so that no two cells wait for each other (`gates`; the nesting:
  `rubric_core.engine.cell`). Its own workflow stays on the experiment's queue, the outermost
  level, so IDs, attempts, Stop and recovery are the same with or without model limits. The
  order has a cost: a cell waiting for a model holds one of the experiment's slots, so a
  configuration on a slow model can keep another's cells waiting unless ``concurrency``
  covers the model limits; in exchange the innermost queue's slot is freed the moment its
  cell ends, and its rate limit counts the cells really started (with two limited models,
  the outer model's counts the cells it let through to the inner model's queue). Each level
  adds up to one poll of its queue (`POLL_S`) to a cell's start, and an outer level's slot is
  held until it learns its child ended (at once in the same process, else within
  `rubric_core.engine.cell.RESULT_POLL_S`); measured ~0.2 s per cell with two levels on
  PostgreSQL. Each model queue is one more queue every process polls.

A configuration's own limits (cells of that configuration at once, started per period: ``eval
--config-limit``, ``--config-rate-limit``) are met the same way, under a limit key of their own
(`config_key`) beside the models'.

The limits are an experiment's, set by its driver (``eval --model-limit``, ``--rate-limit
MODEL=N/PERIOD``, the app's Limits table): another experiment on the same model has limits of
its own.

A cell's workflow ID is deterministic (`workflow_id`): experiment, configuration, repeat, the
cell's thread, an attempt number and the row. Enqueuing an ID that exists is a no-op in DBOS,
so two Resumes (or a Resume racing a worker) never queue a cell twice. The attempt number is
what lets a cell run again after its workflow has completed without ending the cell (its run
was interrupted by a lost database, or ended ``error`` and errors are retried): the next
enqueue uses the next attempt, which every racing enqueuer computes alike. A cancelled
workflow (Stop) gets its next attempt too: resuming it under its own ID would wake its
children, cancelled with it, only on the queues of the limits it was queued under, which a
Resume may have changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Any

from dbos import DBOS, SetEnqueueOptions, SetWorkflowID

from rubric_core.engine import wake
from rubric_core.engine.cell import (
    ACTIVE_STATUSES,
    CELL_ID_PREFIX,
    GATE_ID_PREFIX,
    cell_workflow,
)
from rubric_core.engine.outage import LOST_KEY

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from rubric_core.settings import ExperimentConfig

QUEUE_PREFIX = "rubric-exp-"
"""Queue names: this prefix and the experiment id."""

POLL_S = 0.1
"""How often each process polls an experiment's queue (DBOS's own loop; ~5% of a core per
queue per process while the queue exists)."""

ACTIVE = ACTIVE_STATUSES
"""Workflow statuses of a cell that is queued or running."""



@dataclasses.dataclass(frozen=True)
class ModelLimit:
    """A model's limits within an experiment, over every process."""

    concurrency: int | None = None
    """Cells using the model at once (as worker or grader); None: no limit."""
    rate: tuple[int, float] | None = None
    """At most ``(cells, seconds)`` using the model started per period; None: no limit."""


def queue_name(experiment_id: str) -> str:
    """The name of an experiment's queue."""
    return QUEUE_PREFIX + experiment_id


def model_queue_prefix(experiment_id: str) -> str:
    """What the names of an experiment's model queues start with."""
    return f"{queue_name(experiment_id)}~model~"


def model_queue_name(experiment_id: str, model: str) -> str:
    """The queue of a model's limits within an experiment (the model hashed: any length).

    A configuration's own limits have one too, named by its `config_key`.
    """
    digest = hashlib.sha256(model.encode()).hexdigest()[:16]
    return model_queue_prefix(experiment_id) + digest


CONFIG_KEY_PREFIX = "\x1fconfiguration "
"""What a configuration's limit key starts with (`config_key`): a control character no model
string holds, so a configuration's key never meets a model's."""


def config_key(config_index: int) -> str:
    """The limit key of a configuration's own limits (a partition key or a queue's name)."""
    return f"{CONFIG_KEY_PREFIX}{config_index}"


def gates(used: Sequence[Iterable[str]], experiment_id: str) -> list[list[str]]:
    """Per configuration: the limit queues its cells pass, in the one order every cell uses."""
    return [[model_queue_name(experiment_id, key) for key in sorted(keys)] for keys in used]


@dataclasses.dataclass(frozen=True)
class Routes:
    """How an experiment's cells meet their model and configuration limits (`routes`)."""

    partition: ModelLimit | None
    """The limits of every partition of the experiment's queue, when partitions serve."""
    keys: list[str | None]
    """Per configuration: its cells' partition key (its one limit key), or None."""
    gates: list[list[str]]
    """Per configuration: the limit queues its cells pass (`gates`), when nesting serves."""
    models: dict[str, ModelLimit]
    """The limit keys (models, `config_key`) that have queues of their own, with their
    limits."""


def routes(experiment_id: str, configs: Sequence[ExperimentConfig],
           limits: Mapping[str, ModelLimit],
           config_limits: Mapping[int, ModelLimit] | None = None) -> Routes:
    """How cells meet ``limits`` (by model) and ``config_limits`` (by configuration index).

    A configuration's own limits are one more limit key its cells meet (`config_key`), like
    a model's. Partitions of the experiment's own queue when every configuration meets
    exactly one limit key and all those keys have the same limits (the common case: one model
    everywhere): no level, no latency added. Else a queue per limit key.
    """
    keyed = dict(limits)
    used: list[set[str]] = []
    for index, config in enumerate(configs):
        keys = {config.worker_model, config.grader_model} & limits.keys()
        if config_limits and index in config_limits:
            keyed[config_key(index)] = config_limits[index]
            keys.add(config_key(index))
        used.append(keys)
    none: list[str | None] = [None] * len(configs)
    if not any(used):
        return Routes(None, none, [[] for _ in configs], {})
    shared = {keyed[k] for keys in used for k in keys}
    if all(len(keys) == 1 for keys in used) and len(shared) == 1:
        return Routes(shared.pop(), [next(iter(keys)) for keys in used],
                      [[] for _ in configs], {})
    wanted = {k for keys in used for k in keys}
    return Routes(None, none, gates(used, experiment_id), {k: keyed[k] for k in wanted})


def id_prefix(experiment_id: str) -> str:
    """What every workflow ID of an experiment's cells starts with."""
    return f"{CELL_ID_PREFIX}{experiment_id}:"


def gate_prefix(experiment_id: str) -> str:
    """What every workflow ID of an experiment's cells' levels on model queues starts with."""
    return f"{GATE_ID_PREFIX}{experiment_id}:"


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


def _limiter(rate: tuple[int, float] | None) -> Any:
    return None if rate is None else {"limit": rate[0], "period": rate[1]}


async def register_queue(experiment_id: str, *, concurrency: int,
                         rate_limit: tuple[int, float] | None = None,
                         route: Routes | None = None) -> list[str]:
    """Create (or update) an experiment's queue and its model queues with their limits.

    Args:
        experiment_id: The experiment.
        concurrency: Cells at once over every process.
        rate_limit: At most ``limit`` cells started per ``period`` seconds, over every
            process; None for none.
        route: How the cells meet their model limits (`routes`); None: no model limits.

    Returns:
        The names of the queues registered.

    """
    names = [queue_name(experiment_id)]
    partition = route.partition if route is not None else None
    await wake.register_queue(
        names[0], concurrency=concurrency, limiter=_limiter(rate_limit),
        partition_concurrency=(None if partition is None or partition.concurrency is None
                               else min(partition.concurrency, concurrency)),
        partition_limiter=None if partition is None else _limiter(partition.rate),
        polling_interval_sec=POLL_S)
    for model, limit in sorted((route.models if route is not None else {}).items()):
        names.append(model_queue_name(experiment_id, model))
        await wake.register_queue(names[-1], concurrency=limit.concurrency,
                                  limiter=_limiter(limit.rate), polling_interval_sec=POLL_S)
    return names


async def delete_queue(experiment_id: str) -> None:
    """Remove an experiment's queue and its model queues (no process polls them any more)."""
    prefix = model_queue_prefix(experiment_id)
    for queue in await DBOS.list_queues_async():
        if queue.name.startswith(prefix):
            await wake.delete_queue(queue.name)
    await wake.delete_queue(queue_name(experiment_id))


def _route_of(workflow: Any) -> tuple[str | None, list[str]]:
    """A queued cell workflow's partition key and the model queues it was to pass."""
    args: Sequence[Any] = (workflow.input or {}).get("args") or ()
    return workflow.queue_partition_key, list(args[6]) if len(args) > 6 and args[6] else []


async def enqueue_cells(experiment_id: str, cells: Iterable[tuple[tuple[str, int, int], str]],
                        *, retry_errors: bool, route: Routes | None = None
                        ) -> dict[str, tuple[str, int, int]]:
    """Queue the given cells (``(key, thread id)``) on the experiment's queue, idempotently.

    A cell whose latest workflow is running, or queued the way ``route`` asks, is left as it
    is; one queued another way (model limits changed since) is cancelled and, like one whose
    workflow completed or was cancelled, gets its next attempt; a cell never queued, its
    first. The queues must exist (`register_queue`).

    Args:
        experiment_id: The experiment.
        cells: ``(key, thread id)`` of each cell to queue.
        retry_errors: Whether a cell that ended in an error runs again.
        route: How the cells meet their model limits (`routes`); None: no model limits.

    Returns:
        Each cell's current workflow ID, with its key.

    """
    existing = await DBOS.list_workflows_async(
        workflow_id_prefix=id_prefix(experiment_id), load_input=True, load_output=False)
    latest: dict[str, tuple[int, Any]] = {}  # cell -> (attempt, its latest workflow)
    for workflow in existing:
        parsed = attempt_of(workflow.workflow_id, experiment_id)
        if parsed is not None and parsed[1] >= latest.get(parsed[0], (0, None))[0]:
            latest[parsed[0]] = (parsed[1], workflow)
    queue = await DBOS.retrieve_queue_async(queue_name(experiment_id))
    if queue is None:
        msg = f"experiment {experiment_id} has no queue: register it first"
        raise KeyError(msg)
    ids: dict[str, tuple[str, int, int]] = {}
    stale: list[str] = []
    for key, thread_id in cells:
        cell = f"{key[1]}:{key[2]}:{thread_id}:{key[0]}"
        attempt, found = latest.get(cell, (0, None))
        config = key[1]
        wanted: tuple[str | None, list[str]] = (
            (None, []) if route is None else (route.keys[config], route.gates[config]))
        if found is not None and found.status in ACTIVE:
            if found.status != "ENQUEUED" or _route_of(found) == wanted:
                ids[found.workflow_id] = key
                continue
            stale.append(found.workflow_id)
        wid = workflow_id(experiment_id, key, thread_id, attempt + 1)
        with SetWorkflowID(wid), SetEnqueueOptions(queue_partition_key=wanted[0]):
            if wanted[1]:
                await queue.enqueue_async(cell_workflow, experiment_id, key[0], key[1],
                                          key[2], thread_id, retry_errors, wanted[1])
            else:  # the inputs of a release before model queues: its workers can run it
                await queue.enqueue_async(cell_workflow, experiment_id, key[0], key[1],
                                          key[2], thread_id, retry_errors)
        ids[wid] = key
    if stale:
        await DBOS.cancel_workflows_async(stale, cancel_children=True)
    return ids


async def active_workflows(experiment_id: str) -> list[str]:
    """The experiment's cell workflows queued or running now, on any process."""
    found = await DBOS.list_workflows_async(
        workflow_id_prefix=id_prefix(experiment_id), status=list(ACTIVE), load_input=False,
        load_output=False)
    return [w.workflow_id for w in found]


async def lost_database(workflow_ids: Iterable[str]) -> str | None:
    """The error of one of these cell workflows that a lost database cut, if any, else None.

    Read from the workflows' results (`rubric_core.engine.outage.LOST_KEY`), so it sees the
    cells cut on any process.
    """
    ids = list(workflow_ids)
    if not ids:
        return None
    for workflow in await DBOS.list_workflows_async(workflow_ids=ids, status="SUCCESS",
                                                    load_input=False, load_output=True):
        output = workflow.output
        if isinstance(output, dict) and output.get(LOST_KEY):
            return str(output.get("error") or "the database went away")
    return None


async def running_elsewhere(experiment_id: str, executor_id: str) -> bool:
    """Whether a cell of the experiment (or its level on a model queue) runs on another process.

    One read of the experiment's running workflows (at most its concurrency, with levels).
    """
    for prefix in (id_prefix(experiment_id), gate_prefix(experiment_id)):
        found = await DBOS.list_workflows_async(
            workflow_id_prefix=prefix, status="PENDING", load_input=False, load_output=False)
        if any(w.executor_id != executor_id for w in found):
            return True
    return False


async def cancel_cells(experiment_id: str) -> int:
    """Stop: cancel every queued or running cell workflow of the experiment; how many.

    Queued cells will not start; running ones are stopped by their process within
    `rubric_core.engine.cell.CANCEL_POLL_S` and end after their step. A cell's levels on
    model queues are cancelled with it, and once more by their own prefix: a level that
    queued its child after the first pass (that child starts no body, its cell being
    cancelled, but it would hold a model's slot until dequeued).
    """
    ids = await active_workflows(experiment_id)
    if ids:
        await DBOS.cancel_workflows_async(ids, cancel_children=True)
    left = await DBOS.list_workflows_async(
        workflow_id_prefix=gate_prefix(experiment_id), status=list(ACTIVE), load_input=False,
        load_output=False)
    if left:
        await DBOS.cancel_workflows_async([w.workflow_id for w in left])
    return len(ids)


__all__ = [
    "ACTIVE",
    "CONFIG_KEY_PREFIX",
    "POLL_S",
    "QUEUE_PREFIX",
    "ModelLimit",
    "Routes",
    "active_workflows",
    "attempt_of",
    "cancel_cells",
    "config_key",
    "delete_queue",
    "enqueue_cells",
    "gate_prefix",
    "gates",
    "id_prefix",
    "lost_database",
    "model_queue_name",
    "model_queue_prefix",
    "queue_name",
    "register_queue",
    "routes",
    "running_elsewhere",
    "workflow_id",
]
