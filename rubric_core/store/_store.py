"""`Store`: the store's areas composed into the one object the rest of Rubric Studio uses.

One database holds them all (`rubric_core.store._core.StoreCore`: SQLite or PostgreSQL):

- LangGraph's checkpoint tables, written by the saver that :meth:`Store.saver` returns, keyed by
  each run's ``thread_id``;
- the run index, ``runs`` and ``evaluations`` (`rubric_core.store._runs`), and each run's
  model calls, ``model_calls`` (`rubric_core.store._calls`);
- the library, ``rubrics``, ``rubric_versions`` and ``datasets`` (`rubric_core.store._library`);
- people's ``labels`` of criterion verdicts (`rubric_core.store._labels`);
- ``experiments`` and ``experiment_cells`` (`rubric_core.store._experiments`);
- the lab's answer sets and re-grades (`rubric_core.store._lab`);
- the app's ``drafts`` (`rubric_core.store._drafts`);
- pairwise judgements and their calls (`rubric_core.store._pairwise`);
- ``meta``: which application owns the database and its schema version
  (`rubric_core.store._schema`).

Every write is one transaction (``BEGIN IMMEDIATE`` on SQLite; on PostgreSQL a transaction,
with a row or advisory lock where an operation reads before it writes). A ``Store`` may be
cached and shared across threads.
"""

from __future__ import annotations

from rubric_core.store._calls import CallStore
from rubric_core.store._drafts import DraftStore
from rubric_core.store._experiments import ExperimentStore
from rubric_core.store._lab import LabStore
from rubric_core.store._labels import LabelStore
from rubric_core.store._library import LibraryStore
from rubric_core.store._pairwise import PairwiseStore
from rubric_core.store._runs import RunStore

__all__ = ["Store"]


class Store(CallStore, RunStore, LibraryStore, LabelStore, ExperimentStore, LabStore, DraftStore,
            PairwiseStore):
    """The Rubric Studio database: runs and their calls, library, labels, experiments, the lab.

    Nothing touches the database until :meth:`open` (or the first operation, which opens
    lazily). Use it as a context manager to close the saver's connections when done::

        with Store(default_db_path()) as store:
            run = store.create_run(title="t", prompt="p", rubric="- r", worker_model="w",
                                   grader_model="g", max_iterations=3)

    Args:
        path: A SQLite file (created, with its parent directories, on first open), or a
            ``postgresql://user:password@host:port/dbname`` URL (``postgres://`` too) naming
            an empty database or one of ours (`rubric_core.store._postgres`).

    """
