"""A worker: this process runs the queued units of every experiment and re-grade until stopped.

``rubric-studio worker --db URL`` on any machine that reaches the database joins the pool: it
launches the engine taking units from every queue (within each queue's limits), or from one
experiment's only (``--experiment``, as the workers of ``eval --workers`` do), and every
`rubric_core.engine.recovery.SWEEP_S` re-queues the units of processes that stopped and hands
back its own orphans. A worker restarted by its supervisor (`rubric_core.engine.supervisor`)
launches under the executor ID of the one that died: DBOS re-queues at launch what it left.
The process must have imported the features whose units it runs (``rubric-studio worker``
imports both). Stopping (Ctrl-C, SIGTERM): its cells stop after their step and its gradings in
flight are cancelled, their workflows left ``PENDING`` here for recovery to hand on once this
process has exited (`rubric_core.engine.runtime.leave`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from rubric_core.background import old_objects_frozen, work_loop
from rubric_core.engine import outage
from rubric_core.engine.launch import launch_engine, listen
from rubric_core.engine.queues import queue_name
from rubric_core.engine.recovery import SWEEP_S, recover_stopped_executors, requeue_orphans
from rubric_core.engine.runtime import CELL_ID_PREFIX, GATE_ID_PREFIX, ITEM_ID_PREFIX, leave

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from rubric_core.engine.runtime import Engine
    from rubric_core.store import Store

LEAVE_TIMEOUT_S = 30.0
"""How long a stopping worker waits for its cells to end their step before it exits anyway."""


ORPHAN_PREFIXES = (CELL_ID_PREFIX, GATE_ID_PREFIX, ITEM_ID_PREFIX)
"""The workflows a worker runs, by ID: cells, their levels on model queues, re-grade items."""


async def _sweep(engine: Engine, stop: threading.Event,
                 on_recovered: Callable[[dict[str, int]], None] | None,
                 on_orphans: Callable[[int], None] | None = None) -> None:
    while not stop.is_set():
        with contextlib.suppress(Exception):  # a busy database: the next sweep
            recovered = await recover_stopped_executors(engine.store, me=engine.executor_id)
            if recovered and on_recovered is not None:
                on_recovered(recovered)
        with contextlib.suppress(Exception):
            # Its own: left PENDING here by an outage (DBOS recovers them only at a launch
            # under this executor ID, and a worker that rides out an outage is not relaunched).
            handed = await requeue_orphans(engine.store, list(ORPHAN_PREFIXES),
                                           engine.executor_id)
            if handed and on_orphans is not None:
                on_orphans(len(handed))
        deadline = time.monotonic() + SWEEP_S
        while not stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)


def serve(store: Store, stop: threading.Event, *,
          on_recovered: Callable[[dict[str, int]], None] | None = None,
          on_orphans: Callable[[int], None] | None = None,
          on_cut: Callable[[str, str], None] | None = None,
          experiment_id: str | None = None, executor_id: str | None = None) -> str:
    """Run queued cells here until ``stop`` is set, then leave (see the module docstring).

    Blocks the calling thread, which keeps receiving signals (Ctrl-C raises
    KeyboardInterrupt there: the cells are left as when ``stop`` is set).

    Args:
        store: The database.
        stop: Set it to stop.
        on_recovered: Called with ``{executor: cells}`` whenever a sweep re-queued cells.
        on_orphans: Called with how many of its own orphans a sweep handed back.
        on_cut: Called with ``(experiment id, error)`` for each cell a lost database cut here
            (`rubric_core.engine.outage`), on the engine's loop.
        experiment_id: Take cells from this experiment's queue only; None: from every one.
        executor_id: Launch under this executor ID (a restarted worker); None: a new one.

    Returns:
        This worker's executor ID.

    """
    engine = launch_engine(store, every_queue=experiment_id is None, executor_id=executor_id)
    if experiment_id is not None:
        listen(engine, queue_name(experiment_id))
    outage.listen(on_cut)
    sweeping = asyncio.run_coroutine_threadsafe(_sweep(engine, stop, on_recovered,
                                                            on_orphans), work_loop())
    try:
        with old_objects_frozen():  # as a batch does (`rubric_core.background`)
            while not stop.wait(0.2):
                pass
    finally:
        stop.set()
        leaving = asyncio.run_coroutine_threadsafe(leave(engine, LEAVE_TIMEOUT_S), work_loop())
        leaving.result(LEAVE_TIMEOUT_S + 5)
        with contextlib.suppress(Exception):
            sweeping.result(timeout=5)
        outage.listen(None)
    return engine.executor_id


__all__ = ["LEAVE_TIMEOUT_S", "serve"]
