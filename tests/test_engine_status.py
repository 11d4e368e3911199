"""An experiment's queue state read from the engine's tables (`rubric_core.engine.status`) and
``rubric-studio queue``: a real ``rubric-studio worker`` process holding a cell is shown running
under its pid and host, read by a process that never launched the engine; the command's exit
statuses on SQLite and PostgreSQL; a hostile executor ID in the engine's table shows no text.

Real parts only: DBOS 3.4.0 on the throwaway PostgreSQL cluster or on SQLite files, a loopback
OpenAI-compatible server whose calls wait at a gate the test opens, the offline demo models.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from openai_server import FakeOpenAI, Reply, text, verdict
from test_engine_workers import _worker

from rubric_core import app_support as sup
from rubric_core.background import work_loop
from rubric_core.cli import main
from rubric_core.datasets import parse_dataset
from rubric_core.engine import engine_database, launch_engine, shutdown_engine
from rubric_core.engine import queues as engine_queues
from rubric_core.engine.status import NoEngineTables, queue_state
from rubric_core.experiments import create_experiment, run_experiment
from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]
CRITERION = "answers the question"


@pytest.fixture(autouse=True)
def engine_stopped(request: pytest.FixtureRequest) -> Iterator[None]:
    """The engine a test launched is stopped before its database is dropped (the database's
    fixture is set up first, so it is torn down after this one)."""
    for name in ("pg_url", "db_location"):
        if name in request.fixturenames:
            request.getfixturevalue(name)
    yield
    shutdown_engine()


class GateServer:
    """Worker and grader on a loopback server; every call waits until `gate` is set."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.arrived = threading.Event()
        self.fake = FakeOpenAI(default=self.respond)

    def respond(self, body: dict[str, Any]) -> Reply:
        self.arrived.set()
        self.gate.wait(timeout=120)  # bounded: a test that failed never leaves a thread behind
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        return verdict("satisfied", (), (CRITERION,)) if "GraderResponse" in names else text(
            "an answer")


def _queue_cli(db: str | Path, experiment_id: str) -> tuple[int, str, str]:
    """``rubric-studio queue`` in a process of its own (one that never launched the engine)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "rubric_core", "queue", experiment_id, "--db",
                           str(db)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    return done.returncode, done.stdout, done.stderr


def test_a_workers_cell_shows_running_under_its_pid_then_done(pg_url: str) -> None:
    rows = 3
    server = GateServer()
    data = "prompt\n" + "".join(f"question {i}\n" for i in range(rows))
    with server.fake, Store(pg_url) as store:
        config = ExperimentConfig(worker_model="openai-compatible:w",
                                  grader_model="openai-compatible:g", rubric=f"- {CRITERION}",
                                  base_url=server.fake.base_url)
        exp_id = create_experiment(store, parse_dataset(data, name="q"), [config]).experiment_id
        launch_engine(store, every_queue=False)  # enqueues; runs no cell here
        cells = [(c.key, c.thread_id) for c in store.experiment_cells(exp_id)]

        async def enqueue() -> None:
            await engine_queues.register_queue(exp_id, concurrency=1)
            await engine_queues.enqueue_cells(exp_id, cells, retry_errors=False)

        asyncio.run_coroutine_threadsafe(enqueue(), work_loop()).result(timeout=30)
        before = queue_state(store, exp_id)
        assert (before.queued, before.running, before.done) == (rows, (), 0)
        worker = _worker(pg_url)
        try:
            assert server.arrived.wait(timeout=60), "the worker took no cell"
            # The cell's workflow is PENDING on the worker while its model call waits.
            state = queue_state(store, exp_id)
            shown = f"pid {worker.pid} on {socket.gethostname()}"
            assert [(w.worker, w.cells, w.here, w.gone) for w in state.running] == [
                (shown, 1, False, False)]
            assert (state.queued, state.done, state.cancelled) == (rows - 1, 0, 0)
            status, out, err = _queue_cli(pg_url, exp_id)
            assert status == 0, err
            assert f"{rows - 1} queued · 1 running · 0 done · 0 cancelled" in out
            assert shown in out and "running" in out
            assert worker.poll() is None
            server.gate.set()
            deadline = time.monotonic() + 60
            while queue_state(store, exp_id).done < rows:
                assert time.monotonic() < deadline, "the worker did not end the cells"
                assert worker.poll() is None, worker.communicate()[0]
                time.sleep(0.1)
        finally:
            server.gate.set()
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                worker.communicate(timeout=60)
        after = queue_state(store, exp_id)
        assert (after.queued, after.running, after.done, after.cancelled) == (0, (), rows, 0)
        assert [c.status for c in store.experiment_cells(exp_id)] == ["satisfied"] * rows
        status, out, _ = _queue_cli(pg_url, exp_id)
    assert status == 0
    assert f"0 queued · 0 running · {rows} done · 0 cancelled" in out
    assert "worker" not in out.splitlines()[-1]  # no worker table when nothing runs


def _demo_experiment(store: Store) -> str:
    config = ExperimentConfig(worker_model="demo", grader_model="rules", rubric="")
    return create_experiment(store, demo_dataset(), [config]).experiment_id


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    status = main(argv, out=out)
    return status, out.getvalue(), capsys.readouterr().err


def test_queue_command_exit_statuses(db_location: str | Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    db = str(db_location)
    with Store(db) as store:
        on_engine = _demo_experiment(store)
        never_run = _demo_experiment(store)
        # No engine tables yet: nothing ran on the engine, and reading creates none.
        status, out, _ = _cli(["queue", on_engine, "--db", db], capsys)
        assert status == 1
        assert "has no queue-engine tables" in out
        with pytest.raises(NoEngineTables):
            queue_state(store, on_engine)
        if not db.startswith("postgresql://"):
            assert not Path(engine_database(db).removeprefix("sqlite:///")).exists()
        events = list(run_experiment(store, on_engine, concurrency=4))
        assert events[-1]["status"] == "finished"
        rows = len(store.experiment_cells(on_engine))
    shutdown_engine()  # read by a process whose engine is not launched
    status, out, err = _cli(["queue", on_engine, "--db", db], capsys)
    assert (status, err) == (0, "")
    assert out.splitlines() == [f"experiment {on_engine} (finished):",
                                f"0 queued · 0 running · {rows} done · 0 cancelled"]
    status, out, _ = _cli(["queue", never_run, "--db", db], capsys)
    assert status == 1
    assert "never queued on the engine" in out and "eval --resume ID" in out
    status, out, err = _cli(["queue", "no-such-experiment", "--db", db], capsys)
    assert (status, out) == (2, "")
    assert "error: no experiment 'no-such-experiment'" in err
    # A hostile id: a key is never echoed, SQL is only text, and nothing is changed.
    key = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcd"
    for hostile in (key, "'; DROP TABLE runs;--<b>x</b>"):
        status, out, err = _cli(["queue", hostile, "--db", db], capsys)
        assert (status, out) == (2, "")
        assert "error: no experiment" in err and key not in err
    with Store(db) as store:
        assert len(store.experiment_cells(on_engine)) == rows


def test_a_missing_database_file_is_not_created(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "none.sqlite3"
    status, out, err = _cli(["queue", "x", "--db", str(db)], capsys)
    assert (status, out) == (2, "")
    assert "no database at" in err
    assert list(tmp_path.iterdir()) == []


def test_a_hostile_executor_id_shows_no_text(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    with Store(db) as store:
        exp_id = _demo_experiment(store)
        for _ in run_experiment(store, exp_id):
            pass
        shutdown_engine()
        hostile = "[click me](https://evil.example/x):<b>12</b>:sk-abcdefghijklmnop0123456789"
        engine_file = engine_database(str(db)).removeprefix("sqlite:///")
        with sqlite3.connect(engine_file) as conn:
            conn.execute("UPDATE workflow_status SET status = 'PENDING', executor_id = ? WHERE "
                         "workflow_uuid = (SELECT MIN(workflow_uuid) FROM workflow_status)",
                         (hostile,))
        conn.close()
        state = queue_state(store, exp_id)
        view = sup.queue_view(store, exp_id)
    assert [(w.worker, w.cells) for w in state.running] == [("pid ? on ?", 1)]
    assert list(view.workers["worker"]) == ["pid ? on ?"]
    assert "1 running" in view.headline and view.active


def test_a_cancelled_cell_whose_run_ended_counts_done(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    with Store(db) as store:
        exp_id = _demo_experiment(store)
        for _ in run_experiment(store, exp_id):
            pass
        shutdown_engine()
        engine_file = engine_database(str(db)).removeprefix("sqlite:///")
        with sqlite3.connect(engine_file) as conn:
            # Stop reached two cells only after their last step had ended their runs.
            conn.execute("UPDATE workflow_status SET status = 'CANCELLED' WHERE workflow_uuid IN "
                         "(SELECT workflow_uuid FROM workflow_status ORDER BY workflow_uuid "
                         "LIMIT 2)")
        conn.close()
        state = queue_state(store, exp_id)
        cells = len(store.experiment_cells(exp_id))
    assert (state.done, state.cancelled, state.queued, state.running) == (cells, 0, 0, ())
