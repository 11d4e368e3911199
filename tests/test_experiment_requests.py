"""An experiment's concurrency counts requests: grader repeats never multiply it (#23, hole 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from openai_server import DelayedServer, verdict

from rubric_core.store import Store

ROOT = str(Path(__file__).resolve().parents[1])


@pytest.mark.parametrize("concurrency", [2, 4])
def test_grader_repeats_never_put_more_than_c_requests_in_flight(
    tmp_path: Path, concurrency: int
) -> None:
    # Attack: `eval --concurrency 2` with grader repeats of 3 had 6 requests in flight (10 at C = 4):
    # each cell's slot graded its answer three times at once.
    server = DelayedServer(delay_s=0.1, grader_reply=verdict(
        "satisfied", "fine", ["answers the question"]))
    db, data = tmp_path / "db.sqlite3", tmp_path / "q.csv"
    data.write_text("prompt\n" + "".join(f"question {i}\n" for i in range(8)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": ROOT, "OPENAI_API_KEY": "test-key"}
    with server.fake:
        proc = subprocess.run(
            [sys.executable, "-m", "rubric_core", "eval", "--dataset", str(data), "--rubric",
             "- answers the question", "--config",
             "worker=openai-compatible:w,grader=openai-compatible:g,"
             f"base_url={server.fake.base_url},grader_repeats=3", "--db", str(db),
             "--concurrency", str(concurrency)],
            env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8/8 done, 100% satisfied" in proc.stdout
    assert len(server.fake.requests) == 8 * 4  # one worker call and three grader calls a row
    assert server.peak <= concurrency, server.peak
    assert server.peak > 1  # the slots are still used at once
    with Store(db) as store:
        [exp] = store.list_experiments()
        evaluations = store.evaluations_for_runs(r.run_id for r in store.list_runs(limit=None))
        assert all(ev[0].get("repeats") == 3 for ev in evaluations.values())
        assert exp.experiment_id
