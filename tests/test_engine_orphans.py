"""A cell this process holds but does not run (an orphan) goes back to its queue.

An orphan is ``PENDING`` on this process's executor with nothing here running it: the database
went away between a dequeue and the cell's start, or the cell's end could not be written. DBOS
recovers such workflows only at its next launch under the same executor ID, so a later
session of the experiment in this process (the app's Resume after an outage) waited on it for
ever (`rubric_core.engine.recovery.requeue_orphans`). Real engine on SQLite, loopback server;
the orphan is made as DBOS leaves one: queued by the engine, then marked dequeued here long ago.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any

from openai_server import DelayedServer, verdict
from test_experiments import runs_per_thread

from rubric_core.background import work_loop
from rubric_core.datasets import parse_dataset
from rubric_core.engine import queues
from rubric_core.engine.launch import engine_database, launch_engine
from rubric_core.experiments import create_experiment, experiment_models, run_experiment
from rubric_core.http_retry import SharedBackoff
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

ROWS = 3


def orphan_it(store: Store, executor_id: str, workflow_id: str) -> str:
    """Mark a queued workflow as DBOS leaves an orphan: dequeued by ``executor_id`` a minute
    ago, never started. Returns the engine's SQLite file."""
    long_ago = int(time.time() * 1000) - 60_000
    system = engine_database(store.location).removeprefix("sqlite:///")
    with sqlite3.connect(system) as conn:
        changed = conn.execute(
            "UPDATE workflow_status SET status = 'PENDING', executor_id = ?, "
            "updated_at = ?, started_at_epoch_ms = ? WHERE workflow_uuid = ?",
            (executor_id, long_ago, long_ago, workflow_id)).rowcount
    assert changed == 1
    return system


def one_config_experiment(store: Store, rows: int, base_url: str, models: Any) -> str:
    """An experiment of ``rows`` questions and one configuration on the loopback server
    (worker w, grader g, one criterion); its ID."""
    dataset = parse_dataset("prompt\n" + "".join(f"q {i}\n" for i in range(rows)), name="q")
    config = ExperimentConfig(worker_model="openai-compatible:w",
                              grader_model="openai-compatible:g",
                              rubric="- answers the question", base_url=base_url)
    return create_experiment(store, dataset, [config], models=models).experiment_id


def test_a_cell_this_process_holds_but_does_not_run_is_handed_back(tmp_path: Path) -> None:
    server = DelayedServer(0.05, grader_reply=verdict("satisfied", "fine",
                                                      ["answers the question"]))
    with server.fake, Store(tmp_path / "db.sqlite3") as store:
        backoff = SharedBackoff()
        models = experiment_models(backoff, api_key="test-key")
        exp_id = one_config_experiment(store, ROWS, server.fake.base_url, models)
        engine = launch_engine(store, every_queue=False)
        [first, *_] = store.experiment_cells(exp_id)

        async def queue_it() -> dict[str, Any]:  # as an earlier session did
            await queues.register_queue(exp_id, concurrency=1)
            return await queues.enqueue_cells(exp_id, [(first.key, first.thread_id)],
                                              retry_errors=False)

        [orphan] = asyncio.run_coroutine_threadsafe(queue_it(), work_loop()).result(60)
        system = orphan_it(store, engine.executor_id, orphan)
        events: list[Any] = []
        failure: list[BaseException] = []
        stop = threading.Event()

        def drive() -> None:
            try:
                events.extend(run_experiment(store, exp_id, concurrency=1, models=models,
                                             backoff=backoff, stop=stop))
            except BaseException as exc:  # raised again on the test's thread
                failure.append(exc)

        thread = threading.Thread(target=drive)
        thread.start()
        thread.join(timeout=60)
        stop.set()  # the code before waited on the orphan for ever: end it
        thread.join(timeout=60)
        if failure:
            raise failure[0]
        assert events and events[-1]["status"] == "finished", events[-3:]
        assert sorted(r.status for r in store.list_runs(limit=None)) == ["satisfied"] * ROWS
        assert runs_per_thread(store, exp_id) == [1] * ROWS
        with sqlite3.connect(system) as conn:
            ended = conn.execute("SELECT status FROM workflow_status WHERE workflow_uuid = ?",
                                 (orphan,)).fetchall()
        assert ended == [("SUCCESS",)]


def test_a_worker_hands_back_the_cells_it_holds_but_does_not_run(tmp_path: Path) -> None:
    """A ``rubric-studio worker`` that rode out an outage is not relaunched, so DBOS's launch
    recovery never sees its own orphans: its sweep hands them back (status ``ENQUEUED`` on the
    experiment's queue again, for any worker to take)."""
    from rubric_core.engine import worker

    with Store(tmp_path / "db.sqlite3") as store:
        exp_id = one_config_experiment(
            store, 1, "http://127.0.0.1:9/v1",  # never called: the cell is not run here
            experiment_models(SharedBackoff(), api_key="test-key"))
        # Not listening to the experiment's queue: the queued cell stays where it is put.
        engine = launch_engine(store, every_queue=False)
        [only] = store.experiment_cells(exp_id)

        async def queue_it() -> dict[str, Any]:
            await queues.register_queue(exp_id, concurrency=1)
            return await queues.enqueue_cells(exp_id, [(only.key, only.thread_id)],
                                              retry_errors=False)

        [orphan] = asyncio.run_coroutine_threadsafe(queue_it(), work_loop()).result(60)
        system = orphan_it(store, engine.executor_id, orphan)
        stop, handed = threading.Event(), []

        def told(count: int) -> None:
            handed.append(count)
            stop.set()  # one sweep is enough

        sweep = asyncio.run_coroutine_threadsafe(
            worker._sweep(engine, stop, None, told), work_loop())
        try:
            sweep.result(30)
        finally:
            stop.set()  # the code before never handed it back: end the sweep
            sweep.result(30)
        with sqlite3.connect(system) as conn:
            now = conn.execute("SELECT status, queue_name FROM workflow_status "
                               "WHERE workflow_uuid = ?", (orphan,)).fetchall()
    assert handed == [1]
    assert now == [("ENQUEUED", queues.queue_name(exp_id))]


def test_a_worker_keeps_the_objects_of_its_start_out_of_full_collections(
        tmp_path: Path) -> None:
    """A worker runs cells as a batch does: what the process held once the engine launched is
    frozen (`rubric_core.background.old_objects_frozen`) while it serves, and released when it
    stops."""
    import gc

    from rubric_core.engine import worker

    with Store(tmp_path / "db.sqlite3") as store:
        stop, frozen = threading.Event(), []
        serving = threading.Thread(target=worker.serve, args=(store, stop))
        serving.start()
        deadline = time.monotonic() + 60
        while not gc.get_freeze_count() and time.monotonic() < deadline:
            time.sleep(0.05)
        frozen.append(gc.get_freeze_count())
        stop.set()
        serving.join(60)
    assert frozen[0] > 1000
    assert not serving.is_alive()
    assert gc.get_freeze_count() == 0
