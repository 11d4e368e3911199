"""The queue engine: experiment cells and re-grade items as DBOS Transact workflows on queues.

One concept per module: `_dbos` (DBOS behind one module), `body` (what a feature gives the
engine to run its units; no DBOS), `runtime` (the one workflow runtime and the engine's state),
`launch` (DBOS on the store's own database, once per process), `queues` (queues, workflow IDs,
limits, enqueue, Stop), `recovery` (stopped executors, orphans), `holds` (admission under a
budget, over every process), `wake` (a freed slot starts the next unit at once), `driver` (one
session of a batch, the base of the features' drivers), `worker`, `supervisor` (``eval
--workers N``), `outage` (a lost database under the cells, told once) and `status` (the
queue's state, read without launching). Design and history:
``docs/engine.md``.

Importing this package imports nothing of DBOS; its public names load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rubric_core.engine.launch import (
        APPLICATION_VERSION,
        current_engine,
        engine_database,
        launch_engine,
        shutdown_engine,
    )
    from rubric_core.engine.recovery import recover_stopped_executors

_HOMES = {
    "APPLICATION_VERSION": "rubric_core.engine.launch",
    "current_engine": "rubric_core.engine.launch",
    "engine_database": "rubric_core.engine.launch",
    "launch_engine": "rubric_core.engine.launch",
    "recover_stopped_executors": "rubric_core.engine.recovery",
    "shutdown_engine": "rubric_core.engine.launch",
}


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    return getattr(importlib.import_module(home), name)


__all__ = ["APPLICATION_VERSION", "current_engine", "engine_database", "launch_engine",
           "recover_stopped_executors", "shutdown_engine"]
