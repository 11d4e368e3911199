"""The queue engine on PostgreSQL with two processes: this one driving an experiment
(``run_experiment``) and a ``rubric-studio worker``; the global concurrency limit
holds over both (counted in flight at the loopback server), and after kill -9 of the worker in
the middle of its cells, recovery hands them back and every cell ends exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from openai_server import DelayedServer, verdict
from test_experiments import runs_per_thread

from rubric_core.datasets import parse_dataset
from rubric_core.engine import shutdown_engine
from rubric_core.experiments import (
    SharedBackoff,
    create_experiment,
    experiment_models,
    run_experiment,
)
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = 24
CONCURRENCY = 3
CRITERION = "answers the question"


@pytest.fixture(autouse=True)
def engine_stopped(pg_url: str) -> Iterator[None]:
    """The engine launched on ``pg_url`` is stopped before that database is dropped."""
    yield
    shutdown_engine()


def _worker(db: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": ROOT, "OPENAI_API_KEY": "test-key"}
    proc = subprocess.Popen([sys.executable, "-m", "rubric_core", "worker", "--db", db],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # printed once the worker's engine is launched
    assert first.startswith("worker on "), first + proc.stdout.read()
    return proc


def _drive(store: Store, experiment_id: str, events: list[Any],
           failure: list[BaseException]) -> None:
    backoff = SharedBackoff()
    try:
        events.extend(run_experiment(store, experiment_id, backoff=backoff,
                                     concurrency=CONCURRENCY,
                                     models=experiment_models(backoff, api_key="test-key")))
    except BaseException as exc:  # raised again on the test's thread
        failure.append(exc)


def test_two_processes_share_the_limit_and_a_killed_worker_loses_no_cell(pg_url: str) -> None:
    server = DelayedServer(delay_s=0.25, grader_reply=verdict("satisfied", (), (CRITERION,)),
                           passes=2)
    data = "prompt\n" + "".join(f"question {i}\n" for i in range(ROWS))
    with server.fake, Store(pg_url) as store:
        config = ExperimentConfig(worker_model="openai-compatible:w",
                                  grader_model="openai-compatible:g", rubric=f"- {CRITERION}",
                                  base_url=server.fake.base_url)
        exp = create_experiment(store, parse_dataset(data, name="q"), [config])
        worker = _worker(pg_url)
        events: list[Any] = []
        failure: list[BaseException] = []
        driver = threading.Thread(target=_drive, args=(store, exp.experiment_id, events, failure))
        try:
            driver.start()
            deadline = time.monotonic() + 40
            tag = f":{worker.pid}:"
            # Until the worker ended a cell and holds another mid-run: then kill it.
            while time.monotonic() < deadline:
                assert worker.poll() is None, worker.communicate()[0]
                runs = store.list_runs(limit=None)
                ended_there = sum(r.status == "satisfied" and tag in (r.owner or "")
                                  for r in runs)
                running_there = sum(r.status == "running" and tag in (r.owner or "")
                                    for r in runs)
                if ended_there >= 1 and running_there >= 1:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the worker never ran a cell while the driver ran others")
            assert sum(r.status == "satisfied" for r in runs) < ROWS
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait()
            driver.join(timeout=50)  # its sweep re-queues the dead worker's cells
            assert not driver.is_alive(), "the experiment did not end after the worker died"
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            driver.join(timeout=30)
        if failure:
            raise failure[0]
        cells = store.experiment_cells(exp.experiment_id)
        assert events[-1]["type"] == "experiment_finished"
        assert events[-1]["status"] == "finished"
        assert [c.status for c in cells] == ["satisfied"] * ROWS
        assert runs_per_thread(store, exp.experiment_id) == [1] * ROWS
        satisfied_by = {r.owner.split(":")[1] for r in store.list_runs(limit=None)
                        if r.owner and r.status == "satisfied"}
    assert satisfied_by == {str(worker.pid), str(os.getpid())}  # both processes ran cells
    # The global limit held over both processes, and both had cells in flight at once.
    assert 2 <= server.peak <= CONCURRENCY, server.peak
    # Nothing ran twice: at most the killed worker's calls in flight were made again.
    assert ROWS * 4 <= len(server.fake.requests) <= ROWS * 4 + CONCURRENCY


def test_a_stopped_worker_hands_its_cells_to_recover_and_another_worker(pg_url: str) -> None:
    """SIGTERM: the worker's cells stop after their step and stay queued work (exit 130);
    ``rubric-studio recover`` re-queues them at once and a second worker ends every cell once."""
    import asyncio

    from rubric_core.background import work_loop
    from rubric_core.engine import launch_engine
    from rubric_core.engine import queues as engine_queues

    rows = 8
    server = DelayedServer(delay_s=0.25, grader_reply=verdict("satisfied", (), (CRITERION,)),
                           passes=2)
    data = "prompt\n" + "".join(f"question {i}\n" for i in range(rows))
    with server.fake, Store(pg_url) as store:
        config = ExperimentConfig(worker_model="openai-compatible:w",
                                  grader_model="openai-compatible:g", rubric=f"- {CRITERION}",
                                  base_url=server.fake.base_url)
        exp = create_experiment(store, parse_dataset(data, name="q"), [config])
        exp_id = exp.experiment_id
        engine = launch_engine(store, every_queue=False)  # enqueues; runs no cell here
        cells = [(c.key, c.thread_id) for c in store.experiment_cells(exp_id)]

        async def enqueue() -> None:
            await engine_queues.register_queue(exp_id, concurrency=2)
            await engine_queues.enqueue_cells(exp_id, cells, retry_errors=False)

        asyncio.run_coroutine_threadsafe(enqueue(), work_loop()).result(timeout=30)
        first = _worker(pg_url)
        second: subprocess.Popen[str] | None = None
        try:
            deadline = time.monotonic() + 30
            tag = f":{first.pid}:"
            while not any(r.status == "running" and tag in (r.owner or "")
                          for r in store.list_runs(limit=None)):
                assert time.monotonic() < deadline, "the worker ran no cell"
                assert first.poll() is None, first.communicate()[0]
                time.sleep(0.05)
            first.send_signal(signal.SIGTERM)
            out, _ = first.communicate(timeout=40)
            assert first.returncode == 130, out
            held = [r for r in store.list_runs(limit=None) if tag in (r.owner or "")]
            assert {r.status for r in held} <= {"satisfied", "interrupted"}
            left = [c for c in store.experiment_cells(exp_id) if c.status != "satisfied"]
            assert left, "every cell ended before the worker was stopped"
            env = {**os.environ, "PYTHONPATH": ROOT}
            recover = subprocess.run(
                [sys.executable, "-m", "rubric_core", "recover", "--db", pg_url], cwd=ROOT,
                env=env, capture_output=True, text=True, timeout=60, check=False)
            assert recover.returncode == 0, recover.stderr
            assert "re-queued" in recover.stdout and tag in recover.stdout, recover.stdout
            second = _worker(pg_url)
            deadline = time.monotonic() + 40
            while any(c.status != "satisfied" for c in store.experiment_cells(exp_id)):
                assert time.monotonic() < deadline, "the re-queued cells did not end"
                assert second.poll() is None, second.communicate()[0]
                time.sleep(0.1)
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.communicate(timeout=40)
        assert runs_per_thread(store, exp_id) == [1] * rows
        assert engine.executor_id not in recover.stdout
    assert server.peak <= 2
    # Stopped after a step and continued from it: no model call was made twice.
    assert len(server.fake.requests) == rows * 4
