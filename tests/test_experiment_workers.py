"""Two `rubric-studio eval --resume` workers on one experiment, one killed with kill -9: the
cells are shared (both run some), and every cell is done exactly once, on SQLite and on
PostgreSQL (`db_location`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest
from openai_server import DelayedServer, verdict
from test_experiments import runs_per_thread

from rubric_core import session
from rubric_core.datasets import parse_dataset
from rubric_core.experiments import create_experiment
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store

if TYPE_CHECKING:
    from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = 16
CRITERION = "answers the question"


def _worker(db: Path | str, experiment_id: str, stale_after_s: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": ROOT, "OPENAI_API_KEY": "test-key",
           session.STALE_AFTER_ENV: str(stale_after_s)}
    return subprocess.Popen(
        [sys.executable, "-m", "rubric_core", "eval", "--resume", experiment_id, "--db", str(db),
         "--concurrency", "2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


def test_two_workers_share_cells_and_a_killed_one_loses_none(db_location: Path | str) -> None:
    server = DelayedServer(delay_s=0.2, grader_reply=verdict("satisfied", (), (CRITERION,)),
                           passes=2)
    data = "prompt\n" + "".join(f"question {i}\n" for i in range(ROWS))
    with server.fake, Store(db_location) as store:
        config = ExperimentConfig(worker_model="openai-compatible:w",
                                  grader_model="openai-compatible:g",
                                  rubric=f"- {CRITERION}", base_url=server.fake.base_url)
        exp = create_experiment(store, parse_dataset(data, name="q"), [config])
        exp_id = exp.experiment_id
        first, second = _worker(db_location, exp_id, 3), _worker(db_location, exp_id, 3)
        try:
            owners: set[str] = set()
            deadline = time.monotonic() + 60
            ended, first_holds = 0, False
            # Until both held leases at once, a few cells ended and the first holds a lease
            # right now (so its cells must be taken over): then kill the first.
            while ((len(owners) < 2 or ended < 4 or not first_holds)
                   and time.monotonic() < deadline):
                for proc in (first, second):
                    assert proc.poll() is None, proc.communicate()[0].decode(errors="replace")
                cells = store.experiment_cells(exp_id)
                held = {c.lease_owner for c in cells if c.lease_owner}
                if len(held) == 2:
                    owners |= held
                ended = sum(c.status == "satisfied" for c in cells)
                first_holds = any(f":{first.pid}:" in owner for owner in held)
                time.sleep(0.05)
            assert len(owners) >= 2, "the two workers never ran cells at the same time"
            assert first_holds, "the first worker held no lease when it was killed"
            assert ended < ROWS
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
            out, _ = second.communicate(timeout=90)
        finally:
            for proc in (first, second):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert second.returncode == 0, out.decode(errors="replace")
        cells = store.experiment_cells(exp_id)
    assert [c.status for c in cells] == ["satisfied"] * ROWS
    assert runs_per_thread(db_location, exp_id) == [1] * ROWS
    # Never more calls than a single run of every cell needs: nothing ran twice.
    assert len(server.fake.requests) <= ROWS * 4 + 4  # the killed worker's calls in flight


@pytest.mark.parametrize("raw", ["abc", "1", "99999", "nan"])
def test_stale_after_setting_is_checked(raw: str) -> None:
    env = {**os.environ, "PYTHONPATH": ROOT, session.STALE_AFTER_ENV: raw}
    proc = subprocess.run([sys.executable, "-c", "import rubric_core.session"], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert f"{session.STALE_AFTER_ENV} must be a number of seconds from 3 to 3600" in proc.stderr


def test_stale_after_setting_sets_the_heartbeat() -> None:
    env = {**os.environ, "PYTHONPATH": ROOT, session.STALE_AFTER_ENV: "6"}
    code = ("from rubric_core import session; "
            "print(session.STALE_AFTER_S, session.HEARTBEAT_S)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    assert proc.stdout.split() == ["6.0", "2.0"]

