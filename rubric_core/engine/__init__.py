"""The queue engine: experiment cells as DBOS Transact workflows on durable queues.

Every experiment runs here (`rubric_core.experiments.run_experiment`). One concept per module:
`launch` (DBOS on the store's own database, once per process), `cell` (the cell workflow and
what a process needs to run an experiment's cells), `queues` (an experiment's queue and its
cells' workflow IDs), `budget` (admission under a budget, over every process), `driver` (an
experiment run with `run_experiment`'s events), `recovery` (re-queue the cells and items of
processes that stopped), `worker` (a process that runs queued cells and items until stopped),
`supervisor` (``eval --workers N``), `outage` (a lost database under the cells, told once)
and `status` (the queue's state, read without launching anything). Re-grades
(`rubric_core.lab.run_regrade`) run on the same engine: `item` (the re-grade item workflow)
and `regrade_queue` (a re-grade's queue, its items' IDs, Stop and recovery).

Importing this package imports DBOS; the rest of `rubric_core` imports it only when a run asks
for it.
"""

from rubric_core.engine.launch import (
    APPLICATION_VERSION,
    current_engine,
    engine_database,
    launch_engine,
    shutdown_engine,
)
from rubric_core.engine.recovery import recover_stopped_executors

__all__ = ["APPLICATION_VERSION", "current_engine", "engine_database", "launch_engine",
           "recover_stopped_executors", "shutdown_engine"]
