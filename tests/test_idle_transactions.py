"""A process paused inside a transaction does not keep its run from the process taking it over.

Found by the SIGSTOP drill (`test_engine_sigstop`): a worker paused in the middle of a fenced
checkpoint write holds its run's row ``FOR SHARE``, and the taker's claim (an ``UPDATE`` of
the row) waited for as long as the pause lasted. The server now ends a transaction of ours left
idle for `rubric_core.registry.STALE_AFTER_S` (`rubric_core.store._postgres.
ENDS_IDLE_TRANSACTIONS`). Real PostgreSQL, a real second connection standing in for the paused
process (made with the store's own connection settings).

Found again by the drill in a fresh clone's run: a write paused right after an ``executemany``
(psycopg pipelines it) was not ended at all: the Flush psycopg sends on leaving a pipeline
disarms the server's timer (`rubric_core.store._postgres.execute_each`). The writes inside our
transactions now send one statement at a time; the paused process is stood in for by holding
the real write's thread just after its ``executemany``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver

from rubric_core.settings import RunSettings
from rubric_core.store import Fence, Store, StoreError, _pg_saver, _postgres

ALWAYS_STALE = "9999-01-01T00:00:00.000000+00:00"
IDLE_S = 2


@pytest.fixture
def short_idle_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores opened by a test end a transaction idle for `IDLE_S` (30 s by default)."""
    monkeypatch.setattr(_postgres, "ENDS_IDLE_TRANSACTIONS",
                        f"-c idle_in_transaction_session_timeout={IDLE_S * 1000}")


@pytest.mark.usefixtures("short_idle_timeout")
def test_a_paused_writers_transaction_is_ended_and_the_taker_claims_the_run(pg_url: str) -> None:
    with Store(pg_url) as paused, Store(pg_url) as taker:
        run = paused.create_run(RunSettings(prompt="p", rubric="- c"), owner="paused:1:x")
        # The paused process, inside a fenced write: its run's row read FOR SHARE, then nothing.
        writer = psycopg.connect(pg_url, **paused._backend._conninfo_kwargs())  # type: ignore[union-attr]
        writer.execute("BEGIN")
        writer.execute(_pg_saver._FENCE_SQL, (run.run_id,))
        claimed: list[bool] = []
        went = time.monotonic()
        claim = threading.Thread(target=lambda: claimed.append(taker.claim_run(
            run.run_id, owner="taker:2:y", stale_before=ALWAYS_STALE)))
        claim.start()
        claim.join(IDLE_S + 30)  # without the server's timeout: blocked as long as the pause
        assert claimed == [True], "the claim waited on the paused writer's lock"
        print(f"claimed {time.monotonic() - went:.1f} s after the writer paused")
        record = taker.get_run(run.run_id)
        assert record is not None and record.owner == "taker:2:y"
        # The paused process wakes up to a closed connection: its write goes nowhere.
        with pytest.raises(psycopg.Error, match="idle-in-transaction timeout"):
            writer.execute("INSERT INTO evaluations (run_id) VALUES (%s)", (run.run_id,))
        writer.close()


def test_every_connection_of_the_store_carries_the_timeout(pg_url: str) -> None:
    with Store(pg_url) as store:
        conn = psycopg.connect(pg_url, **store._backend._conninfo_kwargs())  # type: ignore[union-attr]
        with conn:
            row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    assert row is not None and row[0] == "30s"  # registry.STALE_AFTER_S, the default


def _paused_at(monkeypatch: pytest.MonkeyPatch, sql: str, thread: list[threading.Thread],
               paused: threading.Event, woken: threading.Event) -> None:
    """The thread in ``thread`` pauses just before it sends ``sql`` (its session idle)."""
    execute = psycopg.Cursor.execute

    def pausing(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        if query == sql and thread and threading.current_thread() is thread[0]:
            paused.set()
            woken.wait(IDLE_S + 60)
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", pausing)


def _claimed_while_paused(taker: Store, run_id: str, paused: threading.Event) -> float:
    """Claim the run while its writer is paused; seconds the claim took (fails if it hung)."""
    assert paused.wait(30), "the writer never reached its pause"
    went = time.monotonic()
    claimed: list[bool] = []
    claim = threading.Thread(target=lambda: claimed.append(taker.claim_run(
        run_id, owner="taker:2:y", stale_before=ALWAYS_STALE)))
    claim.start()
    claim.join(IDLE_S + 15)  # without the server's timeout: blocked as long as the pause
    assert claimed == [True], "the claim waited on the paused writer's lock"
    return time.monotonic() - went


@pytest.mark.usefixtures("short_idle_timeout")
def test_a_fenced_checkpoint_write_paused_after_its_blobs_is_ended(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    paused, woken = threading.Event(), threading.Event()
    thread: list[threading.Thread] = []
    # Between its blobs (an executemany) and its checkpoint row, as the drill's worker was.
    _paused_at(monkeypatch, PostgresSaver.UPSERT_CHECKPOINTS_SQL, thread, paused, woken)
    with Store(pg_url) as writer_store, Store(pg_url) as taker:
        run = writer_store.create_run(RunSettings(prompt="p", rubric="- c"), owner="paused:1:x")
        fence = Fence(run.run_id, "paused:1:x")
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": ["a message"], "step": 1}  # a blob, inline
        checkpoint["channel_versions"] = {"messages": 1, "step": 1}
        config: Any = {"configurable": {"thread_id": run.thread_id, "checkpoint_ns": "",
                                        **fence.configurable()}}
        failed: list[BaseException] = []

        def write() -> None:
            try:
                writer_store.saver().put(config, checkpoint, {"source": "loop"},
                                         checkpoint["channel_versions"])
            except BaseException as exc:  # what the woken writer met
                failed.append(exc)

        thread.append(threading.Thread(target=write))
        thread[0].start()
        try:
            took = _claimed_while_paused(taker, run.run_id, paused)
        finally:
            woken.set()
            thread[0].join(60)
        print(f"claimed {took:.1f} s after the writer paused")
        # The writer wakes up to a closed connection: its checkpoint and blobs are not stored.
        assert len(failed) == 1 and isinstance(failed[0], StoreError), failed
        with psycopg.connect(pg_url) as conn:
            for table in ("checkpoints", "checkpoint_blobs"):
                row = conn.execute(f"SELECT count(*) FROM {table} WHERE thread_id = %s",
                                   (run.thread_id,)).fetchone()
                assert row == (0,), table


@pytest.mark.usefixtures("short_idle_timeout")
def test_a_transaction_paused_after_writing_many_rows_is_ended(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Tx.executemany` inside a store transaction (call records, cells, answer sets)."""
    paused, woken = threading.Event(), threading.Event()
    thread: list[threading.Thread] = []
    after = "SELECT 1 AS after_the_rows"
    _paused_at(monkeypatch, after, thread, paused, woken)
    with Store(pg_url) as writer_store, Store(pg_url) as taker:
        run = writer_store.create_run(RunSettings(prompt="p", rubric="- c"), owner="paused:1:x")
        with writer_store._connect(write=True) as conn:
            conn.execute("CREATE TABLE scratch_rows (run_id TEXT, n INTEGER)")
        failed: list[BaseException] = []

        def write() -> None:
            try:
                with writer_store._connect(write=True) as conn:
                    conn.execute(_pg_saver._FENCE_SQL.replace("%s", "?"), (run.run_id,))
                    conn.executemany("INSERT INTO scratch_rows (run_id, n) VALUES (?, ?)",
                                     [(run.run_id, i) for i in range(3)])
                    conn.execute(after)
            except BaseException as exc:  # what the woken writer met
                failed.append(exc)

        thread.append(threading.Thread(target=write))
        thread[0].start()
        try:
            _claimed_while_paused(taker, run.run_id, paused)
        finally:
            woken.set()
            thread[0].join(60)
        assert len(failed) == 1, failed
        with taker._connect() as conn:
            assert conn.execute("SELECT count(*) FROM scratch_rows").fetchone()[0] == 0
