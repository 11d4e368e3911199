"""Copy a whole Rubric Studio database to another, SQLite and PostgreSQL either way.

Our tables are copied row by row in one transaction on the destination (all or nothing); the
checkpoints through the two LangGraph savers' own API (``list`` on the source, ``put`` and
``put_writes`` on the destination), as the two savers lay their tables out differently. The
counts copied are checked against what the destination then holds.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rubric_core.store._pg_url import is_url
from rubric_core.store._schema import TABLES, StoreError
from rubric_core.store._store import Store

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from rubric_core.store._schema import Tx

CHECKPOINTS = "checkpoints"
"""Key of `copy_store`'s count of checkpoints."""

CHECKPOINT_WRITES = "checkpoint_writes"
"""Key of `copy_store`'s count of pending checkpoint writes."""

_BATCH = 500
# Rows in creation order, so that the destination's own row order (rowid) keeps it.
_ORDER = {"runs": "created_at, rowid", "experiments": "created_at, rowid"}


def copy_store(source: str | Path, destination: str | Path, *,
               into_nonempty: bool = False) -> dict[str, int]:
    """Copy every run, evaluation, rubric, label, dataset, experiment and checkpoint.

    The source is opened as any store is (an older schema is upgraded in place first); the
    destination is created if it does not exist.

    Args:
        source: A SQLite file or a ``postgresql://`` URL holding a Rubric Studio database.
        destination: Where to copy to (a file or URL too).
        into_nonempty: Copy into a destination that already holds data: rows whose keys are
            there already are kept as they are, and the counts are checked as at least.

    Returns:
        Rows copied per table (our tables by name, then `CHECKPOINTS` and
        `CHECKPOINT_WRITES`).

    Raises:
        StoreError: The source does not exist, both name the same database, the destination
            holds data (without ``into_nonempty``), either is refused by `Store`, a
            checkpoint cannot be copied (the message says how to finish the copy), or the
            destination's counts do not match after the copy.

    """
    if not is_url(source) and not Path(source).expanduser().is_file():
        msg = f"the source database {source} does not exist: give an existing file or URL"
        raise StoreError(msg)
    with Store(source) as src, Store(destination) as dst:
        if _same(src, dst):
            msg = f"the source and the destination are the same database ({src.location})"
            raise StoreError(msg)
        before = _counts(dst)
        if not into_nonempty and any(before.values()):
            held = ", ".join(f"{n} {t}" for t, n in before.items() if n)
            msg = (f"the destination {dst.location} already holds data ({held}): copy into an "
                   "empty database, or pass --into-nonempty (into_nonempty=True) to add to it")
            raise StoreError(msg)
        copied: dict[str, int] = {}
        with src._connect() as reader, dst._connect(write=True) as writer:
            for table in TABLES:
                copied[table] = _copy_table(reader, writer, table)
        failures: tuple[type[Exception], ...] = (
            StoreError, *src._backend.errors, *dst._backend.errors)
        try:
            copied.update(_copy_checkpoints(src.saver(), dst.saver(), _thread_ids(src)))
        except failures as exc:
            # Our tables are in (one transaction); the checkpoints go one by one.
            msg = (f"{str(exc).rstrip('.')}. The copy stopped after our tables were written, so "
                   f"{dst.location} holds a partial copy: run the same copy again with "
                   "--into-nonempty (into_nonempty=True) to finish it (what is there is kept)")
            raise StoreError(msg) from exc
        after = _counts(dst)
    wrong = {t: (n, after[t] - before[t]) for t, n in copied.items()
             if (after[t] - before[t] != n if not into_nonempty else after[t] < n)}
    if wrong:
        shown = ", ".join(f"{t}: copied {n}, holds {got}" for t, (n, got) in wrong.items())
        msg = f"the copy to {dst.location} does not match its source ({shown})"
        raise StoreError(msg)
    return copied


def _same(a: Store, b: Store) -> bool:
    if a.backend != b.backend:
        return False
    if a.backend == "sqlite":
        return Path(a.path).resolve() == Path(b.path).resolve()
    return a.location == b.location


def _copy_table(reader: Tx, writer: Tx, table: str) -> int:
    cursor = reader.execute(f"SELECT * FROM {table} ORDER BY {_ORDER.get(table, '1')}")
    names = [d[0] for d in cursor.description if d[0] != "rowid"]  # the destination's own
    wanted = [i for i, d in enumerate(cursor.description) if d[0] != "rowid"]
    insert = (f"INSERT INTO {table} ({', '.join(names)}) VALUES "
              f"({', '.join('?' * len(names))}) ON CONFLICT DO NOTHING")
    count = 0
    while batch := cursor.fetchmany(_BATCH):
        # Pipelined: a copy's rows are many, and no other process waits on them.
        writer.executemany(insert, [tuple(row[i] for i in wanted) for row in batch],
                           pipelined=True)
        count += len(batch)
    return count


def _thread_ids(store: Store) -> list[str]:
    store.saver()  # its tables exist from here on
    with store._connect() as conn:
        return [str(r[0]) for r in conn.execute(
            f"SELECT DISTINCT thread_id FROM {CHECKPOINTS} ORDER BY thread_id")]


def _copy_checkpoints(src: BaseCheckpointSaver[Any], dst: BaseCheckpointSaver[Any],
                      threads: list[str]) -> dict[str, int]:
    checkpoints = writes = 0
    for thread_id in threads:
        # Oldest first, so that each checkpoint's parent is there before it.
        for item in reversed(list(src.list({"configurable": {"thread_id": thread_id}}))):
            ns = item.config["configurable"].get("checkpoint_ns", "")
            parent = item.parent_config or {"configurable": {}}
            config: Any = {"configurable": {**parent["configurable"], "thread_id": thread_id,
                                            "checkpoint_ns": ns}}
            # Every channel's version is "new" here: the destination has none of its blobs.
            saved = dst.put(config, item.checkpoint, item.metadata,
                            dict(item.checkpoint["channel_versions"]))
            by_task: dict[str, list[tuple[str, Any]]] = defaultdict(list)
            for task_id, channel, value in item.pending_writes or ():
                by_task[task_id].append((channel, value))
            for task_id, task_writes in by_task.items():
                dst.put_writes(saved, task_writes, task_id)
            checkpoints += 1
            writes += len(item.pending_writes or ())
    return {CHECKPOINTS: checkpoints, CHECKPOINT_WRITES: writes}


def _counts(store: Store) -> dict[str, int]:
    """Rows per table of ours, and the checkpoints and pending writes (via the saver)."""
    with store._connect() as conn:
        counts = {t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])
                  for t in TABLES}
    saver = store.saver()
    found = writes = 0
    for thread_id in _thread_ids(store):
        for item in saver.list({"configurable": {"thread_id": thread_id}}):
            found += 1
            writes += len(item.pending_writes or ())
    return {**counts, CHECKPOINTS: found, CHECKPOINT_WRITES: writes}
