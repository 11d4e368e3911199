"""The database going away under an experiment's cells: noted once per cell, told once.

A lost database (`rubric_core.store.is_unavailable`: a server restart or crash, a network cut)
ends each cell running at that moment where it stands: its run is recorded ``interrupted``
where the database still took the write (each write is one transaction, so none is
half-written), and its workflow completes with ``lost_database`` in its result
(`rubric_core.experiments.cell.CellBody`), so a Resume continues it on its own thread and
nothing is run twice. What the libraries log about it (DBOS, psycopg) stays out of the terminal
(`rubric_core.library_logs`); the front ends say it once, in the words below:

- the driver of an experiment (``eval``, the app) at the session's end, when cells did not end
  (`experiment_cut_short`);
- a ``rubric-studio worker``, as its cells are cut (`listen`, `worker_cut`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

NOTHING_HALF_WRITTEN = "each write is one transaction, so nothing was half-written"
"""Why a cut cell needs no repair (`rubric_core.store`: every write is one transaction)."""

LOST_KEY = "lost_database"
"""Key of a cell workflow's result: the database went away under the cell (see above)."""

_lock = threading.Lock()
_listener: list[Callable[[str, str], None]] = []


def listen(callback: Callable[[str, str], None] | None) -> None:
    """Call ``callback(experiment_id, error)`` for every cell cut here from now on (None: stop).

    It is called on the engine's event loop, as the cell ends.
    """
    with _lock:
        _listener[:] = [callback] if callback is not None else []


def note_cut(experiment_id: str, error: str) -> None:
    """A cell of ``experiment_id`` running here was cut by a lost database (``error``)."""
    with _lock:
        listeners = list(_listener)
    for callback in listeners:
        callback(experiment_id, error)


def experiment_cut_short(left: int | None, total: int | None, resume: str) -> str:
    """What a driver's front end says when the database went away and cells did not end.

    Args:
        left: Cells that did not end (None: unknown, the database is still away).
        total: The experiment's cells (None: unknown).
        resume: How to continue them, as a sentence (a command, or the page's button).

    """
    which = "cells" if left is None or total is None else f"{left} of {total} cell(s)"
    return (f"The database went away during the experiment: {which} did not end. The cells "
            "it cut were stopped where they stood and recorded interrupted; "
            f"{NOTHING_HALF_WRITTEN}. {resume}")


def worker_cut(experiment_ids: Sequence[str], resume: Callable[[str], str]) -> str:
    """What a worker says when the database went away under its cells.

    Args:
        experiment_ids: The experiments whose cells were cut here.
        resume: The command that continues an experiment's cells.

    """
    commands = "".join(f"\n  {resume(e)}" for e in experiment_ids)
    return ("The database went away: the cells this worker was running were stopped where "
            f"they stood and recorded interrupted; {NOTHING_HALF_WRITTEN}. The worker takes "
            "cells again once the database is back. Continue the cut cells (once the "
            f"experiment's eval has ended) with:{commands}")


__all__ = ["LOST_KEY", "NOTHING_HALF_WRITTEN", "experiment_cut_short", "listen", "note_cut",
           "worker_cut"]
