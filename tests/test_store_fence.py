"""Fenced checkpoints (`rubric_core.store._fence`): a run's writes only while its writer owns it.

Every test runs on SQLite and on PostgreSQL (the ``store`` / ``db_location`` fixtures): the
store's real saver, the real ``runs`` table and the real `Store.claim_run`.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from rubric_core.store import Fence, RunTakenOver, Store

if TYPE_CHECKING:
    from pathlib import Path

ALWAYS_STALE = "9999-01-01T00:00:00.000000+00:00"
"""A ``stale_before`` after any heartbeat: `Store.claim_run` takes the run whatever its state."""


def _tables(store: Store) -> list[str]:
    if store.backend == "sqlite":
        return ["checkpoints", "writes"]
    return ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]


def _rows(store: Store, thread_id: str) -> dict[str, int]:
    """How many rows each checkpoint table holds for a thread."""
    counts = {}
    with store._connect() as conn:
        for table in _tables(store):
            row = conn.execute(f"SELECT COUNT(*) AS n FROM {table} WHERE thread_id = ?",
                               (thread_id,)).fetchone()
            counts[table] = int(row["n"])
    return counts


def _config(thread_id: str, fence: Fence | None, checkpoint_id: str | None = None
            ) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    if fence is not None:
        configurable.update(fence.configurable())
    return {"configurable": configurable}


def _checkpoint(values: dict[str, Any] | None = None) -> Any:
    checkpoint = empty_checkpoint()  # a fresh, time-ordered id, as LangGraph makes them
    checkpoint["channel_values"] = values or {"messages": ["a message"], "step": 1}
    checkpoint["channel_versions"] = dict.fromkeys(checkpoint["channel_values"], 1)
    return checkpoint


def _put(store: Store, thread_id: str, fence: Fence | None,
         parent: str | None = None) -> str:
    """One fenced ``put`` and one ``put_writes`` on its checkpoint; the checkpoint's id."""
    saver = store.saver()
    checkpoint = _checkpoint()
    versions = checkpoint["channel_versions"]
    saved = saver.put(_config(thread_id, fence, parent), checkpoint, {"source": "loop"},
                      versions)
    saver.put_writes({"configurable": {**saved["configurable"],
                                       **(fence.configurable() if fence else {})}},
                     [("messages", ["next"]), ("step", 2)], task_id=str(uuid.uuid4()))
    return str(checkpoint["id"])


def test_a_former_owner_s_writes_are_refused_and_leave_the_tables_unchanged(
        store: Store) -> None:
    run = store.create_run(prompt="p", rubric="- a", owner="old")
    old, new = Fence(run.run_id, "old"), Fence(run.run_id, "new")
    first = _put(store, run.thread_id, old)  # the owner's own writes pass
    before = _rows(store, run.thread_id)
    assert before["checkpoints"] == 1 and not old.lost.is_set()

    assert store.claim_run(run.run_id, stale_before=ALWAYS_STALE, owner="new")
    saver = store.saver()
    with pytest.raises(RunTakenOver, match="taken over by another server or process"):
        saver.put(_config(run.thread_id, old, first), _checkpoint(), {"source": "loop"},
                  {"messages": 2})
    with pytest.raises(RunTakenOver):
        saver.put_writes(_config(run.thread_id, old, first), [("messages", ["late"])],
                         task_id="t-late")
    assert old.lost.is_set()
    assert _rows(store, run.thread_id) == before

    async def late_async_writes() -> None:
        with pytest.raises(RunTakenOver):
            await saver.aput(_config(run.thread_id, old, first), _checkpoint(),
                             {"source": "loop"}, {"messages": 2})
        with pytest.raises(RunTakenOver):
            await saver.aput_writes(_config(run.thread_id, old, first), [("step", 3)],
                                    task_id="t-late-async")

    asyncio.run(late_async_writes())
    assert _rows(store, run.thread_id) == before

    _put(store, run.thread_id, new, first)  # the new owner's pass
    assert _rows(store, run.thread_id)["checkpoints"] == 2 and not new.lost.is_set()
    tuple_ = saver.get_tuple(_config(run.thread_id, None))  # reads are not fenced
    assert tuple_ is not None and tuple_.parent_config is not None
    assert tuple_.parent_config["configurable"]["checkpoint_id"] == first


def test_unfenced_writes_and_writes_to_runs_without_an_owner_pass(store: Store) -> None:
    run = store.create_run(prompt="p", rubric="- a")  # no owner: rows from before owners
    _put(store, run.thread_id, Fence(run.run_id, "anyone"))
    _put(store, "a-thread-of-no-run", None)  # scripts and copies write without a fence
    assert _rows(store, run.thread_id)["checkpoints"] == 1
    assert _rows(store, "a-thread-of-no-run")["checkpoints"] == 1


def test_a_fenced_write_to_a_deleted_run_is_refused(store: Store) -> None:
    run = store.create_run(prompt="p", rubric="- a", owner="o")
    fence = Fence(run.run_id, "o")
    store.delete_run(run.run_id)
    with pytest.raises(KeyError, match="no run with id"):
        _put(store, run.thread_id, fence)
    assert _rows(store, run.thread_id)["checkpoints"] == 0


def test_the_owner_check_and_the_write_are_one_transaction(db_location: Path | str) -> None:
    """A claim racing the former owner's writes: none of them is stored after the claim.

    The writer puts checkpoints until one is refused; the claimer takes the run over while it
    writes and counts the thread's checkpoints as soon as its claim returns. A write whose
    owner check ran before the claim but whose rows landed after it (a check outside the
    write's transaction) would show as one more checkpoint at the end.
    """
    rounds = 40
    with Store(db_location) as store:
        for n in range(rounds):
            run = store.create_run(prompt="p", rubric="- a", owner="old")
            fence = Fence(run.run_id, "old")
            started = threading.Event()
            refused: list[BaseException] = []

            def write(run: Any = run, fence: Fence = fence, started: threading.Event = started,
                      refused: list[BaseException] = refused) -> None:
                parent = None
                for _ in range(10_000):
                    try:
                        parent = _put(store, run.thread_id, fence, parent)
                    except RunTakenOver as exc:
                        refused.append(exc)
                        return
                    started.set()

            writer = threading.Thread(target=write)
            writer.start()
            assert started.wait(60)
            # Let a varying number of writes through first, so the claim lands at varying
            # points of a write.
            for _ in range(n % 5):
                store.get_run(run.run_id)
            assert store.claim_run(run.run_id, stale_before=ALWAYS_STALE, owner="new")
            at_claim = _rows(store, run.thread_id)
            writer.join(60)
            assert not writer.is_alive()
            assert refused, "the former owner's writes went on after the claim"
            assert _rows(store, run.thread_id) == at_claim, f"round {n}"
