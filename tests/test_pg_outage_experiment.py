"""A PostgreSQL server restarted mid-experiment interrupts cells; a plain Resume ends them (#23, 8).

Cells that were writing when the server went away used to end ``error`` ("Lost the
connection …"), and a plain ``eval --resume`` then exited 1 asking for ``--retry-errors``, which
also re-runs cells that genuinely failed. A lost database is no failure of the cell's run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from openai_server import DelayedServer, verdict
from pg_support import create_database, postgres_cluster
from test_experiments import runs_per_thread

from rubric_core.datasets import parse_dataset
from rubric_core.experiments import create_experiment, experiment_models, run_experiment
from rubric_core.http_retry import SharedBackoff
from rubric_core.settings import ExperimentConfig
from rubric_core.store import Store, _postgres

if TYPE_CHECKING:
    import pytest

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
               "RUBRIC_STUDIO_STALE_AFTER_S": "3"}
        proc = subprocess.run(
            [sys.executable, "-m", "rubric_core", "eval", "--resume", exp_id, "--db", url],
            env=env, capture_output=True, text=True, timeout=240, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{ROWS}/{ROWS} done, 100% satisfied" in proc.stdout
        assert runs_per_thread(url, exp_id) == [1] * ROWS
