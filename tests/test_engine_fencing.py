"""A queue-engine worker paused (SIGSTOP) in the middle of a cell, its cell recovered and
finished by another worker, then continued (SIGCONT): it writes nothing after losing the run.

DBOS fences only its own tables, so this is our runs' ownership and fenced checkpoints at work
on the engine with several workers (`test_fenced_takeover`: one CLI run on SQLite): the database is
compared before and after the paused worker wakes, and the cell's thread keeps one checkpoint
lineage. The paused worker's process is alive, so recovery has to find it by its runs' stale
heartbeats (``RUBRIC_STUDIO_STALE_AFTER_S=3``), not by its exit. On PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from conftest import ROOT
from test_fenced_takeover import (
    DEADLINE_S,
    PausableServer,
    _assert_one_lineage,
    _env,
    _run_is_stale,
    _state,
    _wait_for,
)

from rubric_core.background import work_loop
from rubric_core.datasets import parse_dataset
from rubric_core.engine import launch_engine, shutdown_engine
from rubric_core.engine import queues as engine_queues
from rubric_core.experiments import create_experiment
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator
    from pathlib import Path


T = TypeVar("T")


@pytest.fixture(autouse=True)
def engine_stopped(pg_url: str) -> Iterator[None]:
    """The engine launched on ``pg_url`` is stopped before that database is dropped."""
    yield
    shutdown_engine()


@pytest.fixture
def server() -> Iterator[PausableServer]:
    s = PausableServer()
    yield s
    s.fake.stop()


def _worker(db: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # a file, not a pipe: a stopped reader must not block it
        return subprocess.Popen([sys.executable, "-m", "rubric_core", "worker", "--db", db],
                                cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT)


def _on_loop(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on the engine's loop (DBOS's async API lives there)."""
    return asyncio.run_coroutine_threadsafe(work, work_loop()).result(timeout=30)


def _explain(store: Store, thread_id: str, taken: dict[str, Any], after: dict[str, Any],
             log: str, tmp_path: Path) -> str:
    """What differs, with each checkpoint's step and source, and both workers' logs."""
    with store._connect() as conn:
        rows = conn.execute("SELECT checkpoint_id, parent_checkpoint_id, metadata FROM "
                            "checkpoints WHERE thread_id = ? ORDER BY checkpoint_id",
                            (thread_id,)).fetchall()
    lines = [f"run before {taken['run']}", f"run after  {after['run']}"]
    lines += [f"{r[0]} <- {r[1]} {str(r[2])[:300]}" for r in rows]
    second = (tmp_path / "second.log").read_text(encoding="utf-8", errors="replace")
    return "\n".join([*lines, "first worker:", log, "second worker:", second])


def test_a_paused_engine_worker_writes_nothing_after_its_cell_was_recovered(
        pg_url: str, server: PausableServer, tmp_path: Path) -> None:
    with Store(pg_url) as store:
        config = ExperimentConfig(worker_model="openai-compatible:w",
                                  grader_model="openai-compatible:g", rubric="- c1\n- c2",
                                  max_iterations=5, base_url=server.fake.base_url)
        exp_id = create_experiment(store, parse_dataset("prompt\nwrite it\n", name="q"),
                                   [config]).experiment_id
        launch_engine(store, every_queue=False)  # enqueues; runs no cell here
        cells = [(c.key, c.thread_id) for c in store.experiment_cells(exp_id)]

        async def enqueue() -> None:
            await engine_queues.register_queue(exp_id, concurrency=1)
            await engine_queues.enqueue_cells(exp_id, cells, retry_errors=False)

        _on_loop(enqueue())
        first = _worker(pg_url, tmp_path / "first.log")
        second: subprocess.Popen[bytes] | None = None
        try:
            _wait_for(server.held.is_set, "the first worker's second worker call")
            os.kill(first.pid, signal.SIGSTOP)  # mid-pass: its model call is in flight
            (cell,) = store.experiment_cells(exp_id)
            assert cell.run is not None
            run_id, thread_id, first_owner = cell.run.run_id, cell.thread_id, cell.run.owner

            _wait_for(lambda: _run_is_stale(store, run_id),  # as recovery judges it
                      "the paused worker's run to go stale")
            recover = subprocess.run(
                [sys.executable, "-m", "rubric_core", "recover", "--db", pg_url], cwd=ROOT,
                env=_env(), capture_output=True, text=True, timeout=DEADLINE_S, check=False)
            assert recover.returncode == 0, recover.stderr
            assert f"re-queued 1 cell(s) of stopped worker {first_owner.rsplit(':', 1)[0]}:" in (
                recover.stdout), recover.stdout
            second = _worker(pg_url, tmp_path / "second.log")
            # Its workflow completed: the run's ending and last checkpoint are written (a
            # satisfied pass sets the run's status a step before the graph's last checkpoint).
            _wait_for(lambda: store.experiment_cells(exp_id)[0].status == "satisfied"
                      and not _on_loop(engine_queues.active_workflows(exp_id)),
                      "the recovered cell's workflow to complete on the second worker")
            taken = _state(store, run_id, thread_id)
            assert taken["run"][0] == "satisfied" and taken["run"][1] != first_owner
            assert [e[2:] for e in taken["evaluations"]] == [(0, "needs_revision"),
                                                             (1, "satisfied")]
            _assert_one_lineage(taken["checkpoints"])

            os.kill(first.pid, signal.SIGCONT)  # its held call answers; its writes are refused
            first.send_signal(signal.SIGTERM)  # leaves once its cell stopped trying
            code = first.wait(timeout=DEADLINE_S)
            log = (tmp_path / "first.log").read_text(encoding="utf-8")
            assert code == 130, log
            after = _state(store, run_id, thread_id)
            # not one row from the former owner after it woke
            assert after == taken, _explain(store, thread_id, taken, after, log, tmp_path)
            _assert_one_lineage(after["checkpoints"])
        finally:
            if first.poll() is None:
                os.kill(first.pid, signal.SIGCONT)
                first.kill()
                first.wait()
            if second is not None and second.poll() is None:
                second.send_signal(signal.SIGTERM)
                second.wait(timeout=DEADLINE_S)
