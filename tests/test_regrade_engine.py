"""Re-grades on the queue engine, with real processes, a real PostgreSQL and a loopback server:
a ``rubric-studio worker`` and the driver grade one re-grade together under one limit of
requests in flight, a worker killed with kill -9 loses nothing and repeats nothing, Stop then
two Resumes queue nothing twice, and a second `run_regrade` joins instead of being refused."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from holding_server import HoldingServer
from openai_server import DelayedServer, verdict
from pg_support import scalar
from test_engine_workers import _worker

from rubric_core.lab import GraderConfig, create_regrade, parse_answers, run_regrade
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

CRITERION = "answers the question"


def _job(store: Store, count: int, base_url: str, repeats: int = 1) -> str:
    answers = parse_answers("id,request,answer\n" + "".join(
        f"q{i},question {i},reply {i}\n" for i in range(count)), name="qa")
    config = GraderConfig(rubric=f"- {CRITERION}", grader_model="openai-compatible:g",
                          base_url=base_url, grader_repeats=repeats)
    return create_regrade(store, answers, [config]).job_id


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _drive(store: Store, job_id: str, events: list[Any], failure: list[BaseException],
           **options: Any) -> None:
    try:
        events.extend(run_regrade(store, job_id, **options))
    except BaseException as exc:  # raised again on the test's thread
        failure.append(exc)


def _keys(db: str | Path) -> int:
    return int(str(scalar(db, "SELECT COUNT(*) FROM regrade_results")))


def _attempts(db: str | Path, job_id: str) -> list[str]:
    """The re-grade's item workflow IDs in the engine's tables (PostgreSQL)."""
    import psycopg

    with psycopg.connect(str(db)) as conn:
        return [r[0] for r in conn.execute(
            "SELECT workflow_uuid FROM rubric_engine.workflow_status WHERE workflow_uuid LIKE %s",
            (f"rubric-item:{job_id}:%",))]


def test_a_worker_and_the_driver_grade_one_regrade_under_one_limit(pg_url: str) -> None:
    count, concurrency = 40, 3
    server = DelayedServer(0.15, verdict("satisfied", (), (CRITERION,)))
    with server.fake, Store(pg_url) as store:
        job_id = _job(store, count, server.fake.base_url, repeats=2)
        worker = _worker(pg_url)
        try:
            events = list(run_regrade(store, job_id, concurrency=concurrency))
        finally:
            _stop(worker)
        here = sum(e["type"] == "item_graded" for e in events)
        assert events[-1]["type"] == "regrade_finished"
        assert events[-1]["status"] == "finished"
        assert store.get_regrade_job(job_id).status == "finished"  # type: ignore[union-attr]
    assert _keys(pg_url) == count * 2  # every grading recorded, each once (its key)
    assert len(server.fake.requests) == count * 2  # and graded once
    assert 0 < here < count * 2  # the worker graded some, the driver the rest
    # The limit held over both processes, and both had requests in flight at once.
    assert 2 <= server.peak <= concurrency, server.peak
    last = [e for e in events if e["type"] == "regrade_progress"][-1]
    assert last["done"] == last["total"] == count * 2


def test_a_worker_killed_mid_regrade_loses_and_repeats_nothing(pg_url: str) -> None:
    count, concurrency = 30, 2
    server = HoldingServer(free=6, delay_s=0.02)
    with server.fake, Store(pg_url) as store:
        job_id = _job(store, count, server.fake.base_url)
        worker = _worker(pg_url)
        events: list[Any] = []
        failure: list[BaseException] = []
        driver = threading.Thread(target=_drive, args=(store, job_id, events, failure),
                                  kwargs={"concurrency": concurrency})
        driver.start()
        try:
            server.wait_held(concurrency)  # both slots held now: nothing more can end
            pending = scalar(pg_url, "SELECT executor_id FROM rubric_engine.workflow_status "
                                     "WHERE status = 'PENDING' AND name = "
                                     "'rubric_studio.regrade_item'")
            os.kill(worker.pid, signal.SIGKILL)  # with or without an item of its own
            worker.wait()
            recorded = _keys(pg_url)
            server.release()
            driver.join(timeout=90)  # its sweep hands the dead worker's items back
            assert not driver.is_alive(), "the re-grade did not end after the worker died"
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            server.release()
            driver.join(timeout=30)
        if failure:
            raise failure[0]
        assert events[-1]["status"] == "finished"
    assert recorded == 6 and pending is not None
    assert _keys(pg_url) == count
    assert scalar(pg_url, "SELECT COUNT(DISTINCT item_id) FROM regrade_results") == count
    # At most the gradings in flight when it died were made again, none recorded twice.
    assert count <= server.calls <= count + concurrency
    assert server.peak <= concurrency


def test_stop_then_two_resumes_queue_nothing_twice(pg_url: str) -> None:
    count = 12
    server = HoldingServer(free=4, delay_s=0.01)
    stop = threading.Event()
    with server.fake, Store(pg_url) as store:
        job_id = _job(store, count, server.fake.base_url)
        for event in run_regrade(store, job_id, concurrency=2, stop=stop):
            if event["type"] == "regrade_progress" and event["done"] == 4:
                server.wait_held(2)  # both calling, held: nothing more can end
                stop.set()
        assert event["type"] == "regrade_finished" and event["status"] == "stopped"
        assert _keys(pg_url) == 4  # the held gradings were cancelled, not recorded
        first = _attempts(pg_url, job_id)
        assert len(first) == count  # every item queued once
        server.release()
        calls = server.calls
        # Two Resumes at once (two threads of this process, as two app sessions would).
        runs: list[list[Any]] = [[], []]
        failure: list[BaseException] = []
        resumers = [threading.Thread(target=_drive, args=(store, job_id, runs[i], failure),
                                     kwargs={"concurrency": 2}) for i in range(2)]
        for thread in resumers:
            thread.start()
        for thread in resumers:
            thread.join(timeout=60)
        if failure:
            raise failure[0]
        assert all(r[-1]["status"] == "finished" for r in runs)
        # A third, after the end: nothing left, nothing queued.
        assert list(run_regrade(store, job_id))[-1]["status"] == "finished"  # type: ignore[typeddict-item]
    ids = _attempts(pg_url, job_id)
    # Each item not graded before the Stop got exactly one next attempt, whoever asked.
    assert len(ids) == count + (count - 4)
    assert len({i.rsplit(":", 1)[1] for i in ids if ":2:" in i}) == count - 4
    assert server.calls - calls == count - 4  # each answer graded once
    assert _keys(pg_url) == count


def test_a_second_run_joins_instead_of_being_refused(tmp_path: Path) -> None:
    """On SQLite, in one process: a second session of the same re-grade watches and grades
    along; the gradings are made once."""
    count = 16
    server = DelayedServer(0.05, verdict("satisfied", (), (CRITERION,)))
    db = tmp_path / "db.sqlite3"
    with server.fake, Store(db) as store:
        job_id = _job(store, count, server.fake.base_url)
        runs: list[list[Any]] = [[], []]
        failure: list[BaseException] = []
        threads = [threading.Thread(target=_drive, args=(store, job_id, runs[i], failure),
                                    kwargs={"concurrency": 2}) for i in range(2)]
        for thread in threads:
            thread.start()
            time.sleep(0.3)
        for thread in threads:
            thread.join(timeout=60)
        if failure:
            raise failure[0]
    assert [r[-1]["status"] for r in runs] == ["finished", "finished"]
    assert _keys(db) == count == len(server.fake.requests)
    assert server.peak <= 2


def test_an_item_that_ends_unrecorded_while_the_regrade_runs_is_queued_again(
        tmp_path: Path) -> None:
    """An earlier session's item found still running (``PENDING`` on this process's executor:
    a lost database cut its grading, and DBOS had not recorded its end yet) is left to end;
    when it ends with its grading missing, the session queues its next attempt and finishes,
    instead of ending ``stopped`` with the answer ungraded. Real engine on SQLite."""
    import sqlite3

    from rubric_core.engine.launch import APPLICATION_VERSION, engine_database, launch_engine
    from rubric_core.engine.queues import item_workflow_id as workflow_id
    from rubric_core.engine.queues import regrade_queue_name as queue_name
    from rubric_core.engine.runtime import ITEM_WORKFLOW

    count = 6
    server = DelayedServer(0.05, verdict("satisfied", (), (CRITERION,)))
    db = tmp_path / "db.sqlite3"
    with server.fake, Store(db) as store:
        job_id = _job(store, count, server.fake.base_url)
        engine = launch_engine(store, every_queue=False)
        parked = workflow_id(job_id, 0, "q0", 1)
        system = engine_database(store.location).removeprefix("sqlite:///")
        with sqlite3.connect(system) as conn:  # as the earlier session's item was left
            # Dequeued "now" for as long as the test runs (an hour ahead): however slow the
            # session's start, no sweep takes it for an orphan (`requeue_orphans`, whose own
            # test is below) before the test records its end.
            conn.execute("INSERT INTO workflow_status (workflow_uuid, status, name, executor_id, "
                         "application_version, queue_name, started_at_epoch_ms) "
                         "VALUES (?, 'PENDING', ?, ?, ?, ?, ?)",
                         (parked, ITEM_WORKFLOW, engine.executor_id, APPLICATION_VERSION,
                          queue_name(job_id), int((time.time() + 3600) * 1000)))
        events: list[Any] = []
        failure: list[BaseException] = []
        thread = threading.Thread(target=_drive, args=(store, job_id, events, failure),
                                  kwargs={"concurrency": 2})
        thread.start()
        deadline = time.monotonic() + 60
        while _keys(db) < count - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _keys(db) == count - 1, "the other answers were not graded"
        time.sleep(1.0)  # the session watches the parked item: it is running, for all it knows
        assert thread.is_alive()
        with sqlite3.connect(system) as conn:  # DBOS records its end at last: an error
            conn.execute("UPDATE workflow_status SET status = 'ERROR', error = 'lost database' "
                         "WHERE workflow_uuid = ?", (parked,))
        thread.join(timeout=60)
        assert not thread.is_alive()
        if failure:
            raise failure[0]
        assert events[-1]["status"] == "finished", events[-3:]
        assert _keys(db) == count == len(server.fake.requests)

        def second_attempt() -> list[Any]:
            with sqlite3.connect(system) as conn:
                return conn.execute("SELECT status FROM workflow_status WHERE workflow_uuid = ?",
                                    (workflow_id(job_id, 0, "q0", 2),)).fetchall()

        # The grading is recorded before DBOS records its workflow's end, a moment later.
        deadline = time.monotonic() + 60
        while second_attempt() == [("PENDING",)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second_attempt() == [("SUCCESS",)]


def test_an_item_this_process_holds_but_does_not_run_is_handed_back(tmp_path: Path) -> None:
    """An orphan: ``PENDING`` on this process's executor with nothing here running it (the
    database went away between a dequeue and the item's start, or its end could not be
    written). A later session of the re-grade in this process hands it back to the queue and
    finishes, instead of waiting on it forever. Real engine on SQLite."""
    import asyncio
    import sqlite3

    from test_engine_orphans import orphan_it

    from rubric_core.background import work_loop
    from rubric_core.engine import queues
    from rubric_core.engine.launch import engine_database, launch_engine
    from rubric_core.engine.queues import item_workflow_id as workflow_id

    count = 4
    server = DelayedServer(0.05, verdict("satisfied", (), (CRITERION,)))
    db = tmp_path / "db.sqlite3"
    with server.fake, Store(db) as store:
        job_id = _job(store, count, server.fake.base_url)
        engine = launch_engine(store, every_queue=False)
        orphan = workflow_id(job_id, 0, "q0", 1)
        system = engine_database(store.location).removeprefix("sqlite:///")

        async def queue_it() -> None:  # as the earlier session did
            await queues.register_regrade_queue(job_id, concurrency=1)
            await queues.enqueue_items(job_id, [(0, "q0")], {})

        asyncio.run_coroutine_threadsafe(queue_it(), work_loop()).result(60)
        orphan_it(store, engine.executor_id, orphan)
        events: list[Any] = []
        failure: list[BaseException] = []
        stop = threading.Event()
        thread = threading.Thread(target=_drive, args=(store, job_id, events, failure),
                                  kwargs={"concurrency": 1, "stop": stop})
        thread.start()
        thread.join(timeout=60)
        stop.set()  # the old code waited on the orphan for ever: end it
        thread.join(timeout=60)
        if failure:
            raise failure[0]
        assert events and events[-1]["status"] == "finished", events[-3:]
        assert _keys(db) == count == len(server.fake.requests)
        with sqlite3.connect(system) as conn:
            ended = conn.execute("SELECT status FROM workflow_status WHERE workflow_uuid = ?",
                                 (orphan,)).fetchall()
        assert ended == [("SUCCESS",)]


@pytest.mark.parametrize("item_id", [
    pytest.param("q1", id="plain"),
    pytest.param("item:with:colons", id="colons_in_the_answer_id"),
])
def test_an_item_workflow_id_parses_back(item_id: str) -> None:
    from rubric_core.engine.queues import item_workflow_id as workflow_id
    from rubric_core.engine.queues import parse_item_id as parse_id

    assert parse_id(workflow_id("job", 3, item_id, 7)) == ("job", 3, 7, item_id)
    assert parse_id("rubric-cell:x:1:2:t:1:r") is None
