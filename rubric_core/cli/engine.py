"""``rubric-studio worker`` and ``rubric-studio recover``: the queue engine's commands.

``worker`` joins this process to the pool that runs the queued cells of every experiment on a
database, or of one (`rubric_core.engine.worker`; ``eval --workers`` starts its workers with
this command, `rubric_core.engine.supervisor`); ``recover`` re-queues at once the cells of engine
processes that stopped (`rubric_core.engine.recovery`), which workers and drivers otherwise do
every few seconds by themselves.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, TextIO

from rubric_core.store import default_db_path, shown_location

if TYPE_CHECKING:
    import argparse
    from types import FrameType

WORKER_DESCRIPTION = (
    "Run the queued cells of every experiment in --db (queued by eval or the app) and the "
    "queued items of every re-grade, or --experiment's cells only, until Ctrl-C or SIGTERM; "
    "its running cells then stop after their step and its gradings in flight are dropped, "
    "handed to another worker. Exit 130 when stopped."
)
OUTAGE_S = 60.0
"""Cuts of one experiment's cells this close together belong to one outage, said once."""

RECOVER_DESCRIPTION = (
    "Re-queue now the cells held by queue-engine processes that stopped (exited on this "
    "machine, or without a run heartbeat for RUBRIC_STUDIO_STALE_AFTER_S seconds elsewhere)."
)


def add_db_argument(parser: argparse.ArgumentParser) -> None:
    """``--db`` as the other commands have it."""
    parser.add_argument(
        "--db", default=None,
        help="SQLite file or postgresql:// URL (default: the app's database, $RUBRIC_STUDIO_DB)")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """``worker``'s arguments.

    ``--db``, ``--experiment``, and two hidden ones that only ``eval --workers`` gives its
    workers (`rubric_core.engine.supervisor`): ``--executor-id`` (the slot's), and
    ``--supervised`` (stop when standard input closes: the supervisor died).
    """
    import argparse

    add_db_argument(parser)
    parser.add_argument("--experiment", default=None, metavar="EXP_ID",
                        help="run the queued cells of this experiment only")
    parser.add_argument("--executor-id", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)


def _stop_when_stdin_closes(stop: threading.Event) -> None:
    """Set ``stop`` once standard input reaches its end (the supervisor holding it died)."""
    def wait() -> None:
        # The raw descriptor, not sys.stdin: a daemon thread blocked in a buffered read would
        # hold its lock at interpreter shutdown (a fatal error).
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        stop.set()

    threading.Thread(target=wait, name="rubric-supervisor-gone", daemon=True).start()


def worker(args: argparse.Namespace, out: TextIO) -> int:
    """``worker``: run queued cells until stopped; 130 when stopped by a signal.

    A lost database is said once per outage and experiment (`rubric_core.engine.outage`);
    the worker goes on once the database is back.
    """
    import rubric_core.experiments
    import rubric_core.lab  # noqa: F401 - with the line above: the bodies of cells and items
    from rubric_core.cli.eval import resume_command
    from rubric_core.engine.outage import worker_cut
    from rubric_core.engine.worker import serve
    from rubric_core.store import Store

    db = args.db or default_db_path()
    stop = threading.Event()
    if getattr(args, "supervised", False):
        _stop_when_stdin_closes(stop)

    def on_signal(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001 - signal API
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
                if signal.getsignal(sig) is not signal.SIG_IGN}

    def recovered(counts: dict[str, int]) -> None:
        for executor, cells in counts.items():
            out.write(f"re-queued {cells} cell(s) of stopped worker {executor}\n")
            out.flush()

    def orphans(count: int) -> None:
        out.write(f"handed back {count} cell(s) this worker held but no longer ran "
                  "(an outage cut their start or end)\n")
        out.flush()

    told: dict[str, float] = {}  # experiment -> when a cut of it was last seen

    def cut(experiment_id: str, _error: str) -> None:
        # Once per outage and experiment: the cells of one outage are cut within seconds.
        now = time.monotonic()
        last, told[experiment_id] = told.get(experiment_id), now
        if last is None or now - last > OUTAGE_S:
            out.write(worker_cut([experiment_id], lambda e: resume_command(e, db)) + "\n")
            out.flush()

    with Store(db) as store:
        out.write(f"worker on {shown_location(db)}: running queued cells until Ctrl-C\n")
        out.flush()
        try:
            executor = serve(store, stop, on_recovered=recovered, on_orphans=orphans,
                             on_cut=cut, experiment_id=getattr(args, "experiment", None),
                             executor_id=getattr(args, "executor_id", None))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    out.write(f"worker {executor} stopped; its running cells go to the other workers\n")
    return 130


def recover(args: argparse.Namespace, out: TextIO) -> int:
    """``recover``: re-queue the cells of stopped engine processes once; 0."""
    import asyncio

    from rubric_core.background import work_loop
    from rubric_core.engine.launch import launch_engine
    from rubric_core.engine.recovery import recover_stopped_executors
    from rubric_core.store import Store

    db = args.db or default_db_path()
    with Store(db) as store:
        engine = launch_engine(store, every_queue=False)  # recovers, runs no cell itself
        counts = asyncio.run_coroutine_threadsafe(
            recover_stopped_executors(engine.store, me=engine.executor_id),
            work_loop()).result(timeout=120)
    for executor, cells in counts.items():
        out.write(f"re-queued {cells} cell(s) of stopped worker {executor}\n")
    if not counts:
        out.write("no stopped worker holds a cell\n")
    return 0


__all__ = ["RECOVER_DESCRIPTION", "WORKER_DESCRIPTION", "add_db_argument", "add_worker_arguments",
           "recover", "worker"]
