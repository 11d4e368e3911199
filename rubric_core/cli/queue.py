"""``rubric-studio queue EXPERIMENT_ID``: an experiment's cells in the queue engine.

Shows what the engine's tables say now (`rubric_core.engine.status`): cells queued, running
per worker, done and cancelled, whichever processes run them. It launches nothing and joins no
pool, so it can be run beside running workers, on any machine that reaches the database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from rubric_core.cli._common import UsageError, existing_database
from rubric_core.store import shown_location

if TYPE_CHECKING:
    import argparse

    from rubric_core.engine.status import QueueState

DESCRIPTION = (
    "Show an experiment's cells in the queue engine (queued by eval or the app): queued, "
    "running per worker (pid and host), done and cancelled. Exit 0 when "
    "shown, 1 when the engine holds nothing for the experiment (no engine tables in --db, or "
    "the experiment never ran on the engine), 2 for an unknown experiment or database."
)


def add_queue_arguments(parser: argparse.ArgumentParser) -> None:
    """The experiment and ``--db``."""
    from rubric_core.cli.engine import add_db_argument

    parser.add_argument("experiment_id", metavar="EXPERIMENT_ID",
                        help="the experiment's id (eval prints it; the app shows it under "
                             "the results)")
    add_db_argument(parser)


def format_state(state: QueueState) -> str:
    """The queue state as the command prints it: one line of counts, then workers."""
    lines = [f"{state.queued} queued · {state.running_total} running · {state.done} done · "
             f"{state.cancelled} cancelled" + (f" · {state.failed} failed in the engine"
                                               if state.failed else "")]
    if state.running:
        width = max(len(w.worker) for w in state.running)
        lines.append(f"{'worker':<{width}}  running")
        for w in state.running:
            note = " (stopped: recovery re-queues its cells)" if w.gone else ""
            lines.append(f"{w.worker:<{width}}  {w.cells:>7}{note}")
    return "\n".join(lines) + "\n"


def queue(args: argparse.Namespace, out: TextIO) -> int:
    """``queue``: print the experiment's queue state (exit statuses in `DESCRIPTION`)."""
    from rubric_core.engine.status import NoEngineTables, queue_state
    from rubric_core.store import Store

    db = existing_database(args.db)
    with Store(db) as store:
        experiment = store.get_experiment(args.experiment_id)
        if experiment is None:
            msg = f"no experiment {args.experiment_id!r} in {shown_location(db)}"
            raise UsageError(msg)
        head = f"experiment {experiment.experiment_id} ({experiment.status})"
        try:
            state = queue_state(store, experiment.experiment_id)
        except NoEngineTables:
            out.write(f"{head}: {shown_location(db)} has no queue-engine tables; no experiment "
                      "ran on the engine there yet (eval, or the app's Experiments page)\n")
            return 1
    if not state.total:
        out.write(f"{head}: never queued on the engine (it ran before the engine scheduled "
                  "experiments, or not at all); run it with eval --resume ID\n")
        return 1
    out.write(f"{head}:\n{format_state(state)}")
    return 0


__all__ = ["DESCRIPTION", "add_queue_arguments", "format_state", "queue"]
