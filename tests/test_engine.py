"""The queue engine (DBOS) on SQLite, in this process: every cell ended once with its events, Stop
and Resume with every cell run once, and an enqueue repeated that queues nothing twice.

Real parts only: DBOS 3.4.0 on a SQLite file beside the store's, the loopback
OpenAI-compatible server (`openai_server.DelayedServer`) or the offline demo models.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import pytest
from openai_server import DelayedServer, verdict
from test_experiments import runs_per_thread

from rubric_core.background import work_loop
from rubric_core.datasets import parse_dataset
from rubric_core.engine import engine_database, launch_engine, shutdown_engine
from rubric_core.engine import queues as engine_queues
from rubric_core.experiments import (
    SharedBackoff,
    create_experiment,
    experiment_models,
    run_experiment,
)
from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator
    from pathlib import Path

CRITERION = "answers the question"


@pytest.fixture(autouse=True)
def engine_stopped() -> Iterator[None]:
    """Each test launches the engine on its own database; it is stopped afterwards."""
    yield
    shutdown_engine()


@pytest.fixture
def server() -> Iterator[DelayedServer]:
    s = DelayedServer(delay_s=0.1, grader_reply=verdict("satisfied", (), (CRITERION,)), passes=2)
    with s.fake:
        yield s


def _on_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, work_loop()).result(timeout=60)


def _http_experiment(store: Store, server: DelayedServer, rows: int) -> str:
    data = "prompt\n" + "".join(f"question {i}\n" for i in range(rows))
    config = ExperimentConfig(worker_model="openai-compatible:w",
                              grader_model="openai-compatible:g", rubric=f"- {CRITERION}",
                              base_url=server.fake.base_url)
    exp = create_experiment(store, parse_dataset(data, name="q"), [config],
                            models=experiment_models(SharedBackoff(), api_key="test-key"))
    return exp.experiment_id


def _run(store: Store, experiment_id: str, **kwargs: Any) -> Iterator[Any]:
    backoff = SharedBackoff()
    return run_experiment(store, experiment_id, backoff=backoff,
                          models=experiment_models(backoff, api_key="test-key"), **kwargs)


def test_engine_ends_every_cell_once_with_its_events(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.sqlite3") as store:
        exp = create_experiment(store, demo_dataset(), [ExperimentConfig()], repeats=2)
        events = list(run_experiment(store, exp.experiment_id, concurrency=4))
        cells = store.experiment_cells(exp.experiment_id)
        assert len(cells) == 2 * len(demo_dataset().rows)
        assert runs_per_thread(store, exp.experiment_id) == [1] * len(cells)
        assert store.get_experiment(exp.experiment_id).status == "finished"  # type: ignore[union-attr]
        finished = [e for e in events if e["type"] == "cell_finished"]
        assert sorted((e["row_id"], e["config_index"], e["repeat_index"]) for e in finished
                      ) == sorted(c.key for c in cells)
        assert {e["status"] for e in finished} == {c.status for c in cells} - {"pending"}
        assert events[-1]["type"] == "experiment_finished"
        assert events[-1]["status"] == "finished"
        last = [e for e in events if e["type"] == "experiment_progress"][-1]
        assert last["done"] == last["total"] == len(cells)
        assert {c.status for c in cells} == {"satisfied"}
    # DBOS keeps its tables in a file of its own beside the store's.
    assert (tmp_path / "runs.engine.sqlite3").exists()


def test_the_engine_file_commits_in_wal_with_normal_sync(tmp_path: Path) -> None:
    """DBOS's own SQLite defaults (a rollback journal, ``synchronous=FULL``) made each of its
    several transactions a cell create, sync and delete a journal file; the engine file is in
    WAL with ``synchronous=NORMAL`` like the store's, and keeps WAL for every later opener."""
    import sqlite3

    import sqlalchemy as sa
    from dbos import _dbos

    with Store(tmp_path / "runs.sqlite3") as store:
        launch_engine(store, every_queue=False)
        sys_db = _dbos._get_dbos_instance()._sys_db
        with sys_db.engine.connect() as conn:
            assert conn.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(sa.text("PRAGMA synchronous")).scalar() == 1  # NORMAL
        shutdown_engine()
    engine_file = engine_database(str(tmp_path / "runs.sqlite3")).removeprefix("sqlite:///")
    plain = sqlite3.connect(engine_file)
    try:
        assert plain.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        plain.close()


def test_engine_database_is_a_sibling_file_or_the_same_database() -> None:
    assert engine_database("/data/runs.sqlite3") == "sqlite:////data/runs.engine.sqlite3"
    assert engine_database("/data/runs") == "sqlite:////data/runs.engine.sqlite3"
    url = "postgresql://u:p@127.0.0.1:5432/rubric"
    assert engine_database(url) == url


def test_stop_then_resume_runs_every_cell_once(tmp_path: Path, server: DelayedServer) -> None:
    rows = 12
    with Store(tmp_path / "runs.sqlite3") as store:
        exp_id = _http_experiment(store, server, rows)
        events = _run(store, exp_id, concurrency=3)
        ended = 0
        for event in events:
            if event["type"] == "cell_finished":
                ended += 1
                if ended == 3:
                    break
        events.close()  # Stop: queued cells are cancelled, running ones end after their step
        statuses = [c.status for c in store.experiment_cells(exp_id)]
        assert store.get_experiment(exp_id).status == "stopped"  # type: ignore[union-attr]
        assert 3 <= statuses.count("satisfied") < rows
        assert "running" not in statuses
        assert _on_loop(engine_queues.active_workflows(exp_id)) == []
        finished = [e for e in _run(store, exp_id, concurrency=3)
                    if e["type"] == "cell_finished"]
        assert len(finished) == rows - statuses.count("satisfied")
        cells = store.experiment_cells(exp_id)
        assert {c.status for c in cells} == {"satisfied"}
        assert runs_per_thread(store, exp_id) == [1] * rows
    # Stopped after a step, continued from it: not one model call was made twice.
    assert len(server.fake.requests) == rows * 4
    assert server.peak <= 3


def test_a_cell_dequeued_just_before_a_stop_starts_nothing_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue hands the second cell out as the first ends; it reaches its body only after
    Stop returned (held here on its way, where a loaded machine would be slow). It runs nothing:
    before, it ran on after the Stop, with nobody waiting for it (a closed store: an error)."""
    import threading

    from rubric_core.engine import runtime

    held, release = threading.Event(), threading.Event()
    batch_of = runtime._batch
    calls = [0]

    async def slow_batch(eng: Any, kind: str, batch_id: str) -> Any:
        calls[0] += 1
        if calls[0] == 2:  # the second cell, dequeued as the first ended
            held.set()
            await asyncio.to_thread(release.wait, 60)
        return await batch_of(eng, kind, batch_id)

    monkeypatch.setattr(runtime, "_batch", slow_batch)
    with Store(tmp_path / "runs.sqlite3") as store:
        exp = create_experiment(store, demo_dataset(), [ExperimentConfig()])
        events = run_experiment(store, exp.experiment_id, concurrency=1)
        for event in events:
            if event["type"] == "cell_finished":
                break
        assert held.wait(60), "the second cell was not handed out"
        events.close()  # Stop: returns with the second cell on its way, not yet running
        assert store.get_experiment(exp.experiment_id).status == "stopped"  # type: ignore[union-attr]
        release.set()
        deadline = time.monotonic() + 60
        while _on_loop(engine_queues.active_workflows(exp.experiment_id)):
            assert time.monotonic() < deadline, "the held cell's workflow did not end"
            time.sleep(0.05)
        runs = store.list_runs(limit=None)
        assert len(runs) == 1, [(r.status, r.error) for r in runs]  # the first cell's alone


def test_enqueuing_twice_queues_and_runs_nothing_twice(tmp_path: Path, server: DelayedServer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")  # a cell run by no driver: the env's keys
    rows = 6
    with Store(tmp_path / "runs.sqlite3") as store:
        exp_id = _http_experiment(store, server, rows)
        launch_engine(store)
        cells = [(c.key, c.thread_id) for c in store.experiment_cells(exp_id)]

        async def enqueue_twice() -> list[dict[str, tuple[str, int, int]]]:
            await engine_queues.register_queue(exp_id, concurrency=2)
            first = await engine_queues.enqueue_cells(exp_id, cells, retry_errors=False)
            second = await engine_queues.enqueue_cells(exp_id, cells, retry_errors=False)
            return [first, second]

        first, second = _on_loop(enqueue_twice())
        assert first == second and len(first) == rows
        deadline = time.monotonic() + 30
        while _on_loop(engine_queues.active_workflows(exp_id)):
            assert time.monotonic() < deadline, "the queued cells did not end"
            time.sleep(0.1)
        assert {c.status for c in store.experiment_cells(exp_id)} == {"satisfied"}
        # Enqueued once more through a Resume: every cell ended, so nothing is queued or run.
        events = list(_run(store, exp_id, concurrency=2))
        assert [e for e in events if e["type"] == "cell_finished"] == []
        assert events[-1]["status"] == "finished"
        assert runs_per_thread(store, exp_id) == [1] * rows
    assert len(server.fake.requests) == rows * 4
    assert server.peak <= 2


def test_a_bad_rate_limit_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.sqlite3") as store:
        exp = create_experiment(store, demo_dataset(), [ExperimentConfig()])
        with pytest.raises(ValueError, match="a rate limit is a whole number"):
            list(run_experiment(store, exp.experiment_id, rate_limit=(0, 60.0)))


def test_a_rate_limit_holds(tmp_path: Path) -> None:
    from dbos import DBOS

    rows, limit, period = 6, 2, 1.0
    data = "prompt,rubric\n" + "".join(
        f'"Write the word spring {i}.","- Mentions spring"\n' for i in range(rows))
    with Store(tmp_path / "runs.sqlite3") as store:
        exp = create_experiment(store, parse_dataset(data, name="r"), [ExperimentConfig()])
        events = list(run_experiment(store, exp.experiment_id, concurrency=rows,
                                     rate_limit=(limit, period)))
        assert events[-1]["status"] == "finished"
        assert runs_per_thread(store, exp.experiment_id) == [1] * rows
    workflows = DBOS.list_workflows(workflow_id_prefix=engine_queues.id_prefix(exp.experiment_id),
                                    load_input=False, load_output=False)
    starts = sorted((w.dequeued_at or 0) / 1000 for w in workflows)
    assert len(starts) == rows
    # The queue's limiter started at most `limit` cells in any period (its own start times).
    for i in range(len(starts) - limit):
        assert starts[i + limit] - starts[i] >= period - 0.01, starts


def test_the_process_runs_experiments_after_the_engine_stopped(tmp_path: Path,
                                                               server: DelayedServer) -> None:
    # DBOS makes its thread pool the work loop's default executor; stopping the engine must
    # leave the loop one that works (the models' HTTP clients resolve addresses on it).
    for name in ("first", "second"):
        with Store(tmp_path / f"{name}.sqlite3") as store:
            exp_id = _http_experiment(store, server, 2)
            backoff = SharedBackoff()
            events = list(run_experiment(store, exp_id, backoff=backoff,
                                         models=experiment_models(backoff, api_key="test-key")))
            assert [e["status"] for e in events if e["type"] == "cell_finished"] == [
                "satisfied"] * 2
        shutdown_engine()


def test_eval_runs_on_the_engine_and_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    import contextlib
    import io

    from rubric_core.cli import main

    db = str(tmp_path / "runs.sqlite3")
    out = io.StringIO()
    code = main(["eval", "--dataset", "bundled", "--db", db,
                 "--concurrency", "8", "--rate-limit", "1000/s"], out=out)
    assert code == 0, out.getvalue()
    assert "24/24 done, 100% satisfied" in out.getvalue()
    for argv, message in (
            (["--workers", "0"], "--workers must be from 1 to the concurrency (4)"),
            (["--workers", "5"], "--workers must be from 1 to the concurrency (4)"),
            (["--rate-limit", "10/fortnight"], "expected N/PERIOD"),
            (["--rate-limit", "1/1000000000s"], "period of at most 24 h"),
            (["--rate-limit", "99999999999/s"], "at most 1,000,000 cells"),
            (["--workers", "2"], "--workers N needs a PostgreSQL --db")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["eval", "--dataset", "bundled", "--db", db, *argv],
                        out=io.StringIO()) == 2
        assert message in err.getvalue()


def test_a_driving_process_takes_no_other_experiments_cells(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.sqlite3") as store:
        other = create_experiment(store, demo_dataset(), [ExperimentConfig()], name="other")
        mine = create_experiment(store, demo_dataset(), [ExperimentConfig()], name="mine")
        launch_engine(store, every_queue=False)  # as run_experiment does
        cells = [(c.key, c.thread_id) for c in store.experiment_cells(other.experiment_id)]

        async def queue_other() -> None:
            await engine_queues.register_queue(other.experiment_id, concurrency=4)
            await engine_queues.enqueue_cells(other.experiment_id, cells, retry_errors=False)

        _on_loop(queue_other())
        events = list(run_experiment(store, mine.experiment_id, concurrency=4))
        assert events[-1]["status"] == "finished"
        # The other experiment's cells wait for a worker: this process ran none of them.
        assert len(_on_loop(engine_queues.active_workflows(other.experiment_id))) == len(cells)
        assert {c.status for c in store.experiment_cells(other.experiment_id)} == {"pending"}


def test_ctrl_c_of_eval_on_the_engine_stops_it_resumably(tmp_path: Path,
                                                        server: DelayedServer) -> None:
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    db = tmp_path / "runs.sqlite3"
    with Store(db) as store:
        exp_id = _http_experiment(store, server, 12)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "test-key"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rubric_core", "eval", "--resume", exp_id, "--db", str(db),
         "--concurrency", "2"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with Store(db) as store:
            deadline = time.monotonic() + 30
            while not any(c.status == "satisfied" for c in store.experiment_cells(exp_id)):
                assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
                time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert "interrupted" in err
    with Store(db) as store:
        assert store.get_experiment(exp_id).status == "stopped", out + err  # type: ignore[union-attr]
        assert "running" not in {c.status for c in store.experiment_cells(exp_id)}
        launch_engine(store)
        assert _on_loop(engine_queues.active_workflows(exp_id)) == []  # all cancelled
        events = list(_run(store, exp_id, concurrency=2))
        assert events[-1]["status"] == "finished"
        assert runs_per_thread(store, exp_id) == [1] * 12
    assert len(server.fake.requests) == 12 * 4


def test_stopping_the_engine_does_not_wait_for_a_database_that_is_gone(pg_server: str) -> None:
    """DBOS retries a lost database without end; `shutdown_engine` waits its settle time only.

    (A test that left the engine launched on a dropped database hung the next one's teardown.)
    """
    from pg_support import create_database, drop_database

    from rubric_core.engine import launch_engine, shutdown_engine

    url = create_database(pg_server)
    with Store(url) as store:
        launch_engine(store, every_queue=False)
    drop_database(url)  # ends every connection to it, DBOS's pool included
    started = time.monotonic()
    shutdown_engine(settle_s=1.0)
    assert time.monotonic() - started < 120  # returned (settle_s=1): before the fix it never did
    other_url = create_database(pg_server)
    with Store(other_url) as other:  # and a new launch works
        assert launch_engine(other, every_queue=False).location == other.connect_location()
        shutdown_engine()
    drop_database(other_url)


def test_the_engine_moves_to_another_database_only_when_nothing_holds_it(
        tmp_path: Path) -> None:
    from rubric_core.engine.launch import current_engine, engine_for

    with Store(tmp_path / "a.sqlite3") as first, Store(tmp_path / "b.sqlite3") as second:
        ids = {}
        for store in (first, second):  # one process, one database after the other
            ids[store] = create_experiment(store, demo_dataset(), [ExperimentConfig()]
                                           ).experiment_id
            events = list(run_experiment(store, ids[store]))
            assert events[-1]["status"] == "finished"
            engine = current_engine()
            assert engine is not None and engine.location == store.connect_location()
        with engine_for(second):  # an experiment of this process runs on b
            with pytest.raises(ValueError,
                               match=r"for an experiment it runs now, not .*a\.sqlite3"):
                list(run_experiment(first, ids[first]))
            with pytest.raises(ValueError, match="one database at a time per process"):
                launch_engine(first, every_queue=False)
        shutdown_engine()
