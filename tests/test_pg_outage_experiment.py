"""A PostgreSQL server restarted mid-experiment interrupts cells; a plain Resume ends them (#23, 8).

Cells that were writing when the server went away used to end ``error`` ("Lost the
connection …"), and a plain ``eval --resume`` then exited 1 asking for ``--retry-errors``, which
also re-runs cells that genuinely failed. A lost database is no failure of the cell's run.

And it reads as one event (#37, 2): ``pg_ctl restart -m fast`` with four cells writing used to
fill ``eval``'s standard error with DBOS's tracebacks, psycopg's "discarding closed connection"
and DBOS's "Notification listener error", and exit 1. Now one message says what happened,
that nothing was half-written and the command that resumes; the exit status is an interrupted
experiment's (130); the libraries' records go to ``--log-file`` only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openai_server import DelayedServer, verdict
from pg_support import create_database, postgres_cluster, writes_held
from test_experiments import runs_per_thread

from rubric_core.datasets import parse_dataset
from rubric_core.experiments import create_experiment, experiment_models, run_experiment
from rubric_core.http_retry import SharedBackoff
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store, _postgres

if TYPE_CHECKING:
    import pytest

LIBRARY_LINES = ("Traceback", "discarding closed connection", "Notification listener error",
                 "WARNING", "StoreUnavailable")
"""What DBOS and psycopg log about a lost database (and our error's name in their tracebacks)."""

ROOT = str(Path(__file__).resolve().parents[1])
ROWS = 8


def test_a_database_restart_interrupts_cells_and_a_plain_resume_finishes_each_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A write waits this long for a connection while the server is down (30 s by default).
    monkeypatch.setattr(_postgres, "_POOL_TIMEOUT_S", 2.0)
    # Two passes a row (four calls), so a cell writes several times while it runs.
    server = DelayedServer(delay_s=0.3, passes=2, grader_reply=verdict(
        "satisfied", "fine", ["answers the question"]))
    with postgres_cluster() as cluster, server.fake:
        url = create_database(cluster.url)
        backoff = SharedBackoff()
        models = experiment_models(backoff, api_key="test-key")
        dataset = parse_dataset("prompt\n" + "".join(f"q {i}\n" for i in range(ROWS)), name="q")
        config = ExperimentConfig(worker_model="openai-compatible:w",
                                  grader_model="openai-compatible:g",
                                  rubric="- answers the question", base_url=server.fake.base_url)
        store = Store(url).open()
        exp_id = create_experiment(store, dataset, [config], models=models).experiment_id
        raised: list[BaseException] = []

        def run() -> None:
            try:
                list(run_experiment(store, exp_id, concurrency=4, models=models,
                                    backoff=backoff))
            except Exception as exc:  # the driver's own writes may fail too: said, not hidden
                raised.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 60
        while len(server.fake.requests) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)  # every slot has a cell in flight
        cluster.stop()  # as a crash would
        time.sleep(4.0)  # every in-flight cell tries to write while it is down
        cluster.start()
        thread.join(timeout=180)
        assert not thread.is_alive()
        store.close()
        with Store(url) as store:
            runs = store.list_runs(limit=None)
        statuses = [r.status for r in runs]
        errors = [r.error for r in runs if r.status == "error"]
        assert not errors, errors  # the database's outage is no cell's failure
        assert len(statuses) < ROWS or set(statuses) != {"satisfied"}  # the outage cut cells

        # A plain resume (no --retry-errors) continues every cut cell on its own thread.
        env = {**os.environ, "PYTHONPATH": ROOT, "OPENAI_API_KEY": "test-key",
               "RUBRIC_STUDIO_STALE_AFTER_S": "3", "RUBRIC_STUDIO_HEARTBEAT_S": "0.25"}
        proc = subprocess.run(
            [sys.executable, "-m", "rubric_core", "eval", "--resume", exp_id, "--db", url],
            env=env, capture_output=True, text=True, timeout=240, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{ROWS}/{ROWS} done, 100% satisfied" in proc.stdout
        assert runs_per_thread(url, exp_id) == [1] * ROWS


def test_a_restart_during_eval_is_said_once_and_exits_as_an_interrupted_experiment(
        tmp_path: Path) -> None:
    server = DelayedServer(delay_s=0.2, passes=2, grader_reply=verdict(
        "satisfied", "fine", ["answers the question"]))
    dataset = tmp_path / "rows.csv"
    dataset.write_text("prompt\n" + "".join(f"q {i}\n" for i in range(ROWS)), encoding="utf-8")
    log = tmp_path / "libraries.log"
    env = {**os.environ, "PYTHONPATH": ROOT, "OPENAI_API_KEY": "test-key"}
    with postgres_cluster() as cluster, server.fake:
        url = create_database(cluster.url)
        proc = subprocess.Popen(
            [sys.executable, "-m", "rubric_core", "eval", "--dataset", str(dataset),
             "--rubric", "- answers the question", "--concurrency", "4", "--db", url,
             "--config", "worker=openai-compatible:w,grader=openai-compatible:g,"
             f"base_url={server.fake.base_url}", "--log-file", str(log)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while server.in_flight < 4:  # every slot has a cell in a model call
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.02)
            # Four cells, each with a write waiting: then the restart ends them all at once.
            with writes_held(url, "runs", waiting=4):
                cluster.restart("fast")
            out, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        exp_id = out.split("experiment ", 1)[1].split()[0]
        resume = f"rubric-studio eval --resume {exp_id} --db {url}"
        # Said once, on standard output; nothing of the libraries on the terminal.
        assert err == "", err
        assert not [line for line in LIBRARY_LINES if line in out], out
        assert out.count("The database went away") == 1, out
        assert proc.returncode == 130, out
        assert "each write is one transaction, so nothing was half-written" in out
        assert out.rstrip().endswith(f"{resume}\ninterrupted: exit 130"), out
        # Asked for, the libraries' own records are in the log file.
        logged = log.read_text(encoding="utf-8")
        assert "Notification listener error" in logged, logged

        # The data as before: the plain resume ends every cell, each once.
        again = subprocess.run([sys.executable, "-m", "rubric_core", *resume.split()[1:]],
                               cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=240, check=False)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"{ROWS}/{ROWS} done, 100% satisfied" in again.stdout
        assert runs_per_thread(url, exp_id) == [1] * ROWS


def test_a_restart_under_a_worker_is_said_once_and_the_worker_goes_on(tmp_path: Path) -> None:
    server = DelayedServer(delay_s=0.2, passes=2, grader_reply=verdict(
        "satisfied", "fine", ["answers the question"]))
    env = {**os.environ, "PYTHONPATH": ROOT, "OPENAI_API_KEY": "test-key"}
    with postgres_cluster() as cluster, server.fake:
        url = create_database(cluster.url)
        dataset = parse_dataset("prompt\n" + "".join(f"q {i}\n" for i in range(ROWS)), name="q")
        config = ExperimentConfig(worker_model="openai-compatible:w",
                                  grader_model="openai-compatible:g",
                                  rubric="- answers the question", base_url=server.fake.base_url)
        store = Store(url).open()
        exp_id = create_experiment(store, dataset, [config]).experiment_id
        worker = subprocess.Popen([sys.executable, "-m", "rubric_core", "worker", "--db", url],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        events: list[Any] = []
        raised: list[BaseException] = []

        def drive() -> None:  # this process queues the cells and watches; the worker runs them
            try:
                events.extend(run_experiment(store, exp_id, concurrency=4, run_here=False))
            except Exception as exc:  # raised again below
                raised.append(exc)

        driver = threading.Thread(target=drive)
        try:
            assert worker.stdout is not None
            assert worker.stdout.readline().startswith("worker on ")
            driver.start()
            deadline = time.monotonic() + 120
            while server.in_flight < 4:
                assert worker.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
            with writes_held(url, "runs", waiting=4):
                cluster.restart("fast")
            driver.join(timeout=240)
            assert not driver.is_alive() and not raised, raised
            assert worker.poll() is None  # it rode out the outage
            worker.send_signal(signal.SIGTERM)
            out, err = worker.communicate(timeout=120)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
            driver.join(timeout=60)
            store.close()
        resume = f"rubric-studio eval --resume {exp_id} --db {url}"
        assert worker.returncode == 130, out + err
        assert err == "", err
        assert not [line for line in LIBRARY_LINES if line in out], out
        assert out.count("The database went away") == 1, out
        assert "each write is one transaction, so nothing was half-written" in out
        assert f"\n  {resume}\n" in out, out
        # The driver saw the cells cut on the worker, from their workflows' results.
        finished = events[-1]
        assert finished["type"] == "experiment_finished" and finished["status"] == "stopped"
        assert "Lost the connection" in finished["lost_database"], finished

        again = subprocess.run([sys.executable, "-m", "rubric_core", *resume.split()[1:]],
                               cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=240, check=False)
        assert again.returncode == 0, again.stdout + again.stderr
        assert runs_per_thread(url, exp_id) == [1] * ROWS
