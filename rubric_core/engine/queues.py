"""The units' queues and workflow IDs: register, enqueue (idempotent), Stop, clean-up.

One DBOS queue per batch (`queue_name`: an experiment's, `regrade_queue_name`: a re-grade's),
whose global concurrency is the batch's concurrency over every process, with an optional rate
limit. An experiment's per-model and per-configuration limits are DBOS's too (`routes`):
partitions of its queue when every configuration meets exactly one limit key and those keys
share their limits, else a queue per limit key that a cell passes nested in its own workflow
(`gates`, `rubric_core.engine.runtime`). Why, and what each costs: ``docs/engine.md``.

A unit's workflow ID is deterministic (`workflow_id`, `item_workflow_id`) and carries an
attempt number: enqueuing an ID that exists is a no-op, so two Resumes never queue a unit
twice, and a unit whose workflow ended without ending the unit (Stop, a lost database, an error
retried) is queued again under the next attempt, which every racing enqueuer computes alike.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Any

from rubric_core.engine import _dbos
from rubric_core.engine.outage import LOST_KEY
from rubric_core.engine.runtime import (
    CELL_ID_PREFIX,
    GATE_ID_PREFIX,
    ITEM_ID_PREFIX,
    cell_workflow,
    current_engine,
    item_workflow,
    note_cancelled,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from rubric_core.settings import ExperimentConfig

QUEUE_PREFIX = "rubric-exp-"
"""An experiment's queue's name: this prefix and the experiment id."""
REGRADE_QUEUE_PREFIX = "rubric-regrade-"
"""A re-grade's queue's name: this prefix and the re-grade's id."""

POLL_S = 0.1
"""How often each process polls a queue (DBOS's own loop)."""

ACTIVE = _dbos.ACTIVE
"""Workflow statuses of a unit that is queued or running."""

CONFIG_KEY_PREFIX = "\x1fconfiguration "
"""What a configuration's limit key starts with (`config_key`): a control character no model
string holds, so a configuration's key never meets a model's."""


@dataclasses.dataclass(frozen=True)
class ModelLimit:
    """A model's (or a configuration's) limits within an experiment, over every process."""

    concurrency: int | None = None
    """Cells using the model at once (as worker or grader); None: no limit."""
    rate: tuple[int, float] | None = None
    """At most ``(cells, seconds)`` using the model started per period; None: no limit."""


def queue_name(experiment_id: str) -> str:
    """The name of an experiment's queue."""
    return QUEUE_PREFIX + experiment_id


def regrade_queue_name(job_id: str) -> str:
    """The name of a re-grade's queue."""
    return REGRADE_QUEUE_PREFIX + job_id


def model_queue_prefix(experiment_id: str) -> str:
    """What the names of an experiment's model queues start with."""
    return f"{queue_name(experiment_id)}~model~"


def model_queue_name(experiment_id: str, model: str) -> str:
    """The queue of a limit key within an experiment (hashed: any length)."""
    return model_queue_prefix(experiment_id) + hashlib.sha256(model.encode()).hexdigest()[:16]


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
    """The limit keys (models, `config_key`) that have queues of their own, with their limits."""


def routes(experiment_id: str, configs: Sequence[ExperimentConfig],
           limits: Mapping[str, ModelLimit],
           config_limits: Mapping[int, ModelLimit] | None = None) -> Routes:
    """How cells meet ``limits`` (by model) and ``config_limits`` (by configuration index)."""
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


def item_prefix(job_id: str) -> str:
    """What every workflow ID of a re-grade's items starts with."""
    return f"{ITEM_ID_PREFIX}{job_id}:"


def workflow_id(experiment_id: str, key: tuple[str, int, int], thread_id: str,
                attempt: int) -> str:
    """A cell's workflow ID; the row id last (it may hold ``:``)."""
    row_id, config_index, repeat_index = key
    return (f"{id_prefix(experiment_id)}{config_index}:{repeat_index}:{thread_id}:{attempt}:"
            f"{row_id}")


def attempt_of(workflow: str, experiment_id: str) -> tuple[str, int] | None:
    """``(the ID without its attempt, attempt)`` of one of the experiment's workflow IDs."""
    parts = _cell_parts(workflow, experiment_id)
    if parts is None or not parts[3].isdigit():
        return None
    config_index, repeat_index, thread_id, attempt, row_id = parts
    return f"{config_index}:{repeat_index}:{thread_id}:{row_id}", int(attempt)


def cell_key_of(workflow: str, experiment_id: str) -> tuple[str, int, int] | None:
    """The cell key ``(row, configuration, repeat)`` of a cell's workflow ID; None if not one."""
    parts = _cell_parts(workflow, experiment_id)
    if parts is None or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return parts[4], int(parts[0]), int(parts[1])


def _cell_parts(workflow: str, experiment_id: str) -> list[str] | None:
    """A cell workflow ID's configuration, repeat, thread, attempt and row; None if not one."""
    prefix = id_prefix(experiment_id)
    parts = workflow[len(prefix):].split(":", 4) if workflow.startswith(prefix) else []
    return parts if len(parts) == 5 else None


def thread_of(workflow: str) -> str:
    """The cell's thread in a cell's (or its level's) workflow ID; "" if not one."""
    parts = workflow.split(":", 6)
    return parts[4] if len(parts) == 7 else ""


def item_workflow_id(job_id: str, config_index: int, item_id: str, attempt: int) -> str:
    """An item's workflow ID; the answer's id last (it may hold ``:``)."""
    return f"{item_prefix(job_id)}{config_index}:{attempt}:{item_id}"


def parse_item_id(workflow: str) -> tuple[str, int, int, str] | None:
    """``(job, configuration, attempt, answer)`` of an item's workflow ID; None if not one."""
    if not workflow.startswith(ITEM_ID_PREFIX):
        return None
    parts = workflow[len(ITEM_ID_PREFIX):].split(":", 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], int(parts[1]), int(parts[2]), parts[3]


async def _register(name: str, concurrency: int | None, **options: Any) -> None:
    """Register a queue with DBOS and mirror its global limit for wakes."""
    await _dbos.register_queue(name, concurrency=concurrency, poll_s=POLL_S, **options)
    if (engine := current_engine()) is not None:
        if concurrency is None:
            engine.limits.pop(name, None)
        else:
            engine.limits[name] = concurrency


async def _delete(name: str) -> None:
    await _dbos.delete_queue(name)
    if (engine := current_engine()) is not None:
        engine.limits.pop(name, None)


async def register_queue(experiment_id: str, *, concurrency: int,
                         rate_limit: tuple[int, float] | None = None,
                         route: Routes | None = None) -> list[str]:
    """Create (or update) an experiment's queue and its model queues; their names."""
    names = [queue_name(experiment_id)]
    partition = route.partition if route is not None else None
    await _register(
        names[0], concurrency, rate=rate_limit,
        partition_concurrency=(None if partition is None or partition.concurrency is None
                               else min(partition.concurrency, concurrency)),
        partition_rate=None if partition is None else partition.rate)
    for model, limit in sorted((route.models if route is not None else {}).items()):
        names.append(model_queue_name(experiment_id, model))
        await _register(names[-1], limit.concurrency, rate=limit.rate)
    return names


async def register_regrade_queue(job_id: str, *, concurrency: int) -> str:
    """Create (or update) a re-grade's queue (the latest registration's limit holds); its name."""
    name = regrade_queue_name(job_id)
    await _register(name, concurrency)
    return name


async def delete_queue(experiment_id: str) -> None:
    """Remove an experiment's queue and its model queues (no process polls them any more)."""
    prefix = model_queue_prefix(experiment_id)
    for name in await _dbos.queue_names():
        if name.startswith(prefix):
            await _delete(name)
    await _delete(queue_name(experiment_id))


async def delete_regrade_queue(job_id: str) -> None:
    """Remove a re-grade's queue."""
    await _delete(regrade_queue_name(job_id))


def _route_of(workflow: Any) -> tuple[str | None, list[str]]:
    """A queued cell workflow's partition key and the model queues it was to pass."""
    args = _dbos.args_of(workflow)
    return workflow.queue_partition_key, list(args[6]) if len(args) > 6 and args[6] else []


async def enqueue_cells(experiment_id: str, cells: Iterable[tuple[tuple[str, int, int], str]],
                        *, retry_errors: bool, route: Routes | None = None
                        ) -> dict[str, tuple[str, int, int]]:
    """Queue the given cells (``(key, thread id)``) on the experiment's queue, idempotently.

    A cell whose latest workflow is running, or queued the way ``route`` asks, is left as it
    is; one queued another way (limits changed since) is cancelled and, like one whose
    workflow ended, gets its next attempt. Returns each cell's current workflow ID, with its
    key. The queues must exist (`register_queue`).
    """
    latest: dict[str, tuple[int, Any]] = {}  # cell -> (attempt, its latest workflow)
    for workflow in await _dbos.list_workflows(workflow_id_prefix=id_prefix(experiment_id),
                                               load_input=True):
        parsed = attempt_of(workflow.workflow_id, experiment_id)
        if parsed is not None and parsed[1] >= latest.get(parsed[0], (0, None))[0]:
            latest[parsed[0]] = (parsed[1], workflow)
    queue = await _dbos.queue(queue_name(experiment_id), f"experiment {experiment_id}")
    ids: dict[str, tuple[str, int, int]] = {}
    stale: list[str] = []
    for key, thread_id in cells:
        attempt, found = latest.get(f"{key[1]}:{key[2]}:{thread_id}:{key[0]}", (0, None))
        wanted: tuple[str | None, list[str]] = (
            (None, []) if route is None else (route.keys[key[1]], route.gates[key[1]]))
        if found is not None and found.status in ACTIVE:
            if found.status != "ENQUEUED" or _route_of(found) == wanted:
                ids[found.workflow_id] = key
                continue
            stale.append(found.workflow_id)
        wid = workflow_id(experiment_id, key, thread_id, attempt + 1)
        # Without model queues, the inputs of a release before them: its workers can run it.
        extra = [wanted[1]] if wanted[1] else []
        await _dbos.enqueue(queue, cell_workflow, experiment_id, key[0],
                            key[1], key[2], thread_id, retry_errors, *extra, workflow_id=wid,
                            partition=wanted[0])
        ids[wid] = key
    await _dbos.cancel(stale, children=True)
    return ids


async def latest_items(job_id: str) -> dict[tuple[int, str], tuple[int, str]]:
    """Per item ``(configuration, answer)``: its latest attempt and that workflow's status."""
    latest: dict[tuple[int, str], tuple[int, str]] = {}
    for workflow in await _dbos.list_workflows(workflow_id_prefix=item_prefix(job_id)):
        parsed = parse_item_id(workflow.workflow_id)
        if parsed is None or parsed[0] != job_id:
            continue
        key = (parsed[1], parsed[3])
        if parsed[2] >= latest.get(key, (0, ""))[0]:
            latest[key] = (parsed[2], workflow.status)
    return latest


async def enqueue_items(job_id: str, items: Iterable[tuple[int, str]],
                        latest: dict[tuple[int, str], tuple[int, str]]) -> int:
    """Queue the given items on the re-grade's queue, idempotently; how many were queued.

    An item whose latest workflow is queued or running is left; one that ended gets its next
    attempt. ``latest`` (`latest_items`) is updated with what was queued.
    """
    queue = await _dbos.queue(regrade_queue_name(job_id), f"re-grade {job_id}")
    queued = 0
    for key in items:
        attempt, status = latest.get(key, (0, ""))
        if status in ACTIVE:
            continue
        await _dbos.enqueue(queue, item_workflow, job_id, key[0], key[1],
                            workflow_id=item_workflow_id(job_id, key[0], key[1], attempt + 1))
        latest[key] = (attempt + 1, "ENQUEUED")
        queued += 1
    return queued


async def active_workflows(experiment_id: str) -> list[str]:
    """The experiment's cell workflows queued or running now, on any process."""
    return [w.workflow_id for w in await _dbos.list_workflows(
        workflow_id_prefix=id_prefix(experiment_id), status=list(ACTIVE))]


async def active_items(job_id: str) -> list[str]:
    """The re-grade's item workflows queued or running now, on any process."""
    return [w.workflow_id for w in await _dbos.list_workflows(
        workflow_id_prefix=item_prefix(job_id), status=list(ACTIVE))]


async def lost_database(workflow_ids: Iterable[str]) -> str | None:
    """The error of one of these cell workflows that a lost database cut, if any, else None.

    Read from the workflows' results (`rubric_core.engine.outage.LOST_KEY`): cut anywhere.
    """
    ids = list(workflow_ids)
    if not ids:
        return None
    for workflow in await _dbos.list_workflows(workflow_ids=ids, status=_dbos.DONE,
                                               load_output=True):
        output = workflow.output
        if isinstance(output, dict) and output.get(LOST_KEY):
            return str(output.get("error") or "the database went away")
    return None


async def running_elsewhere(experiment_id: str, executor_id: str) -> bool:
    """Whether a cell of the experiment (or its level) runs on another process."""
    for prefix in (id_prefix(experiment_id), gate_prefix(experiment_id)):
        found = await _dbos.list_workflows(workflow_id_prefix=prefix, status=_dbos.RUNNING)
        if any(w.executor_id != executor_id for w in found):
            return True
    return False


async def cancel_cells(experiment_id: str) -> int:
    """Stop: cancel every queued or running cell of the experiment, with its levels; how many.

    Levels are cancelled once more by their own prefix: one that queued its child after the
    first pass would hold a model's slot until dequeued.
    """
    ids = await active_workflows(experiment_id)
    await _dbos.cancel(ids, children=True)
    left = await _dbos.list_workflows(workflow_id_prefix=gate_prefix(experiment_id),
                                      status=list(ACTIVE))
    await _dbos.cancel([w.workflow_id for w in left])
    return len(ids)


async def cancel_items(job_id: str) -> int:
    """Stop: cancel every queued or running item of the re-grade; how many."""
    ids = await active_items(job_id)
    if ids and (engine := current_engine()) is not None:
        note_cancelled(engine, ids)  # one dequeued here before the cancel lands grades nothing
    await _dbos.cancel(ids)
    return len(ids)


__all__ = [
    "ACTIVE", "CONFIG_KEY_PREFIX", "POLL_S", "QUEUE_PREFIX", "REGRADE_QUEUE_PREFIX",
    "ModelLimit", "Routes", "active_items", "active_workflows", "attempt_of", "cancel_cells",
    "cancel_items", "config_key", "delete_queue", "delete_regrade_queue", "enqueue_cells",
    "enqueue_items", "gate_prefix", "gates", "id_prefix", "item_prefix", "item_workflow_id",
    "latest_items", "lost_database", "model_queue_name", "model_queue_prefix", "parse_item_id",
    "queue_name", "register_queue", "register_regrade_queue", "regrade_queue_name", "routes",
    "running_elsewhere", "thread_of", "workflow_id",
]
