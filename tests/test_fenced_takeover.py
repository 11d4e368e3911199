"""A paused process that lost its run writes nothing more: fenced checkpoints, real processes.

A CLI ``run`` (``python -m rubric_core``) against the loopback OpenAI-compatible server is
stopped with SIGSTOP while a model call is in flight; its run goes stale
(``RUBRIC_STUDIO_STALE_AFTER_S=3``), another process resumes it to the end; then the first is
continued with SIGCONT. It must store no checkpoint, write, evaluation or ending after losing
the run (the database is compared before and after it wakes, and the thread's checkpoints form
one lineage: every parent in the thread, exactly one leaf), and exit with the takeover message.
The same for an experiment cell, whose paused process is an ``eval`` worker. On SQLite and on
PostgreSQL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pytest
from conftest import ROOT
from openai_server import FakeOpenAI, Reply, slow, text, verdict

from rubric_core.models import BASE_URL_ENV
from rubric_core.store import Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

STALE_AFTER_S = 3
DEADLINE_S = 120.0
"""Generous bound on every wait for a condition (nothing here waits on a fixed sleep)."""


class PausableServer:
    """Worker and grader on one loopback server; the worker's second call is held back.

    The worker's k-th answer of the run is ``draft k`` (k = the user messages it was sent);
    the grader fails ``draft 1`` and passes any later draft. The first request for ``draft 2``
    sets `held` and is answered only after `HOLD_S`, so the test can stop its process while
    the call is in flight; later requests for it (the resumer's) are answered at once.
    """

    HOLD_S = 3.0

    def __init__(self) -> None:
        self.held = threading.Event()
        self.fake = FakeOpenAI(default=self.respond)

    def respond(self, body: dict[str, Any]) -> Reply:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        if "GraderResponse" in names:
            latest = json.dumps(body["messages"][-1])
            return verdict("needs_revision", ("c2",)) if "draft 1" in latest else verdict(
                "satisfied")
        k = sum(m.get("role") == "user" for m in body.get("messages") or [])
        if k == 2 and not self.held.is_set():
            self.held.set()
            return slow(self.HOLD_S, text("draft 2"))
        return text(f"draft {k}")


@pytest.fixture
def server() -> Iterator[PausableServer]:
    s = PausableServer()
    yield s
    s.fake.stop()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and k != BASE_URL_ENV
           and not k.startswith(("LANGSMITH_", "LANGCHAIN_"))}
    env["RUBRIC_STUDIO_STALE_AFTER_S"] = str(STALE_AFTER_S)
    env["RUBRIC_STUDIO_HEARTBEAT_S"] = "0.25"  # a live owner is never taken for gone
    return env


def _cli(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # a file, not a pipe: a stopped reader must not block it
        return subprocess.Popen([sys.executable, "-m", "rubric_core", *args], cwd=ROOT,
                                env=_env(), stdout=out, stderr=subprocess.STDOUT)


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            msg = f"gave up after {DEADLINE_S:.0f} s waiting for {what}"
            raise AssertionError(msg)
        time.sleep(0.05)


def _run_is_stale(store: Store, run_id: str) -> bool:
    """Whether the run's heartbeat is older than `STALE_AFTER_S`, by the database's clock."""
    current = store.get_run(run_id)
    assert current is not None
    age = (datetime.fromisoformat(current.observed_at)
           - datetime.fromisoformat(current.updated_at))
    return age.total_seconds() > STALE_AFTER_S + 0.5


def _state(store: Store, run_id: str, thread_id: str) -> dict[str, Any]:
    """Everything a writer of the run could have written, read from the database."""
    writes = "writes" if store.backend == "sqlite" else "checkpoint_writes"
    with store._connect() as conn:
        run = conn.execute("SELECT status, owner, updated_at, iterations, duration_s, error "
                           "FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        checkpoints = conn.execute(
            "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id FROM checkpoints "
            "WHERE thread_id = ? ORDER BY checkpoint_id", (thread_id,)).fetchall()
        written = conn.execute(
            f"SELECT checkpoint_id, task_id, idx FROM {writes} WHERE thread_id = ? "
            "ORDER BY checkpoint_id, task_id, idx", (thread_id,)).fetchall()
        evaluations = conn.execute(
            "SELECT seq, grading_run_id, iteration, result FROM evaluations WHERE run_id = ? "
            "ORDER BY seq", (run_id,)).fetchall()
    return {"run": tuple(run), "checkpoints": [tuple(r) for r in checkpoints],
            "writes": [tuple(r) for r in written], "evaluations": [tuple(r) for r in evaluations]}


def _assert_one_lineage(checkpoints: list[tuple[Any, ...]]) -> None:
    """Every checkpoint's parent is in the thread, one root, exactly one leaf (no fork)."""
    main = [(cid, parent) for ns, cid, parent in checkpoints if ns == ""]
    ids = {cid for cid, _ in main}
    parents = [parent for _, parent in main if parent is not None]
    assert set(parents) <= ids, "a checkpoint's parent is missing from the thread"
    assert len(main) - len(parents) == 1, "the thread has more than one root"
    leaves = ids - set(parents)
    assert len(leaves) == 1, f"the thread forked: {len(leaves)} leaves"
    assert len(parents) == len(set(parents)), "two checkpoints share a parent (a fork)"


def test_a_cli_run_stopped_and_taken_over_writes_nothing_after_it_wakes(
        db_location: Path | str, server: PausableServer, tmp_path: Path) -> None:
    db = str(db_location)
    first = _cli(["run", "--db", db, "--thread", "th", "--prompt", "write it",
                  "--rubric", "- c1\n- c2", "--max-iterations", "5",
                  "--model", "openai-compatible:worker", "--grader",
                  "openai-compatible:grader", "--base-url", server.fake.base_url],
                 tmp_path / "first.log")
    try:
        _wait_for(server.held.is_set, "the first run's second worker call")
        os.kill(first.pid, signal.SIGSTOP)  # mid-pass: its model call is in flight
        with Store(db) as store:
            record = store.latest_run_for_thread("th")
            assert record is not None
            run_id, first_owner = record.run_id, record.owner

            _wait_for(lambda: _run_is_stale(store, run_id),
                      "the stopped run's heartbeat to go stale")
            second = subprocess.run(
                [sys.executable, "-m", "rubric_core", "run", "--db", db, "--thread", "th",
                 "--resume"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                timeout=DEADLINE_S, check=False)
            assert second.returncode == 0, second.stdout + second.stderr
            assert "status: satisfied after 2 grading pass(es)" in second.stdout
            taken = _state(store, run_id, "th")
            assert taken["run"][0] == "satisfied" and taken["run"][1] != first_owner
            assert [e[2:] for e in taken["evaluations"]] == [(0, "needs_revision"),
                                                             (1, "satisfied")]
            _assert_one_lineage(taken["checkpoints"])

            os.kill(first.pid, signal.SIGCONT)
            code = first.wait(timeout=DEADLINE_S)
            log = (tmp_path / "first.log").read_text(encoding="utf-8")
            assert code == 2, log
            assert "was taken over by another server or process" in log, log
            assert "Traceback" not in log, log
            after = _state(store, run_id, "th")
            assert after == taken  # not one row from the former owner after it woke
            _assert_one_lineage(after["checkpoints"])
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
            first.wait()


def test_an_eval_worker_stopped_and_taken_over_writes_nothing_after_it_wakes(
        db_location: Path | str, server: PausableServer, tmp_path: Path) -> None:
    from rubric_core.datasets import parse_dataset
    from rubric_core.experiments import create_experiment
    from rubric_core.settings import ExperimentConfig

    db = str(db_location)
    with Store(db) as store:
        config = ExperimentConfig(worker_model="openai-compatible:w",
                                  grader_model="openai-compatible:g", rubric="- c1\n- c2",
                                  max_iterations=5, base_url=server.fake.base_url)
        exp_id = create_experiment(store, parse_dataset("prompt\nwrite it\n", name="q"),
                                   [config]).experiment_id
        worker = ["eval", "--resume", exp_id, "--db", db, "--concurrency", "1"]
        first = _cli(worker, tmp_path / "first.log")
        try:
            _wait_for(server.held.is_set, "the first worker's second worker call")
            os.kill(first.pid, signal.SIGSTOP)  # mid-pass: its model call is in flight
            (cell,) = store.experiment_cells(exp_id)
            assert cell.run is not None
            run_id, thread_id, first_owner = cell.run.run_id, cell.thread_id, cell.run.owner

            def stale() -> bool:  # the run's heartbeat expired
                return _run_is_stale(store, run_id)

            _wait_for(stale, "the stopped worker's run to go stale")
            second = subprocess.run([sys.executable, "-m", "rubric_core", *worker], cwd=ROOT,
                                    env=_env(), capture_output=True, text=True,
                                    timeout=DEADLINE_S, check=False)
            assert second.returncode == 0, second.stdout + second.stderr
            taken = _state(store, run_id, thread_id)
            assert taken["run"][0] == "satisfied" and taken["run"][1] != first_owner
            assert [e[2:] for e in taken["evaluations"]] == [(0, "needs_revision"),
                                                             (1, "satisfied")]
            _assert_one_lineage(taken["checkpoints"])

            os.kill(first.pid, signal.SIGCONT)
            first.wait(timeout=DEADLINE_S)
            log = (tmp_path / "first.log").read_text(encoding="utf-8")
            print(f"the former worker exited {first.returncode}:\n{log}")
            assert "Traceback" not in log, log
            after = _state(store, run_id, thread_id)
            assert after == taken, log  # not one row from the former owner after it woke
            _assert_one_lineage(after["checkpoints"])
            (done,) = store.experiment_cells(exp_id)
            assert done.status == "satisfied"
        finally:
            if first.poll() is None:
                os.kill(first.pid, signal.SIGCONT)
                first.kill()
                first.wait()
